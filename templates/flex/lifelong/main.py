"""Flex Template entry point of the lifelong job (FLEX_TEMPLATE_PYTHON_PY_FILE).

The launcher runs ``python main.py --<parameter>=<value> ... <Dataflow options>``; unknown
parameters and bad values end with a one-line error and exit code 2 (see pipelines/common.py).
"""

import sys

from pipelines.lifelong import main

if __name__ == "__main__":
    sys.exit(main())
