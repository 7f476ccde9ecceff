"""``python -m flowledger.verify``: see the package docstring."""

import sys

from flowledger.verify import main

sys.exit(main())
