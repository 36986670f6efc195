import sys

from quantizer_job.cli import main

sys.exit(main())
