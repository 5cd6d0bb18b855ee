"""``python -m explorer.bench``: see ``explorer.bench``."""
import sys

from explorer.bench import main

sys.exit(main())
