"""``python -m mrcstack.sim``: see :mod:`mrcstack.sim.cli`."""

import sys

from mrcstack.sim.cli import main

sys.exit(main())
