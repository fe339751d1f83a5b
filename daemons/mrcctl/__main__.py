"""``python -m mrcstack.daemons.mrcctl``: the same as ``mrcctl``."""

from mrcstack.daemons.mrcctl import main

raise SystemExit(main())
