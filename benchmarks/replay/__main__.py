import sys

from benchmarks.replay import main

sys.exit(main(sys.argv[1:]))
