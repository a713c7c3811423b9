"""`python -m devenv.demo`: see `devenv.demo.cli`."""

import sys

from devenv.demo.cli import main

sys.exit(main())
