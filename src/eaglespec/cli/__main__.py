"""python -m eaglespec.cli"""

import sys

from eaglespec.cli.main import main

sys.exit(main())
