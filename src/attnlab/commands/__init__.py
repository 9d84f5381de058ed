"""The ``attnlab`` subcommands, one module each. A module is a row of the table: ``add_parser(sub)`` adds its
parser, whose defaults name ``main(args)``, the work, and where the arguments depend on each other or on the file
system ``check(args)``, which runs first. Parsing imports no torch, only the papers' declarations (``papers``): each
``main`` imports what it runs, so that --help answers at once.
"""

from . import bench, demo, doctor, evaluation, export, generate, listing, papers, report, reproduce, results, train

# in the order --help lists them
COMMANDS = (train, evaluation, generate, export, listing, papers, demo, reproduce, report, results, bench, doctor)
