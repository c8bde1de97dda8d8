import sys

from decoding.cli import main

sys.exit(main())
