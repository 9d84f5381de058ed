#!/usr/bin/env python3
"""Prints suites' plans side by side on one GPU (attnlab.lab.side_by_side); scripts/gpu-science.sh runs it."""

import sys

from attnlab.lab.side_by_side import main
from attnlab.papers import get_suite

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], get_suite))
