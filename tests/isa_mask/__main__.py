import sys

from tests.isa_mask import main

raise SystemExit(main(sys.argv[1:]))
