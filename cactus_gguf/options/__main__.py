"""python -m cactus_gguf.options [COMMAND]: print COMMAND's flag table (docs/options.md; default run)."""
import sys

from .table import markdown_table

print(markdown_table(sys.argv[1] if len(sys.argv) > 1 else "run"), end="")
