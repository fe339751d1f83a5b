"""``python -m mrcstack``: see :mod:`mrcstack.cli`."""

import sys

from mrcstack.cli import main

sys.exit(main())
