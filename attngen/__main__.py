import sys

from attngen.cli import main

sys.exit(main())
