"""Sphinx configuration of the bno-hvd documentation (MyST Markdown pages, furo theme).

Build: ``sphinx-build -W --keep-going -n -b html docs docs/_build/html`` (strict: any warning, also an
unresolved cross-reference, fails); ``tests/docs/test_docs_build.py`` runs the same build.
"""

import os
import sys

import mpi4py

# autodoc imports bno_hvd; nothing it imports may start MPI (no job, no singleton daemon)
mpi4py.rc.initialize = False
mpi4py.rc.finalize = False
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

project = "bno-hvd"
author = "the bno-hvd authors"
copyright = "the bno-hvd authors, Apache License 2.0"
release = "0.1.0"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

myst_heading_anchors = 3  # links to a page's sections: [text](page.md#a-heading)
myst_enable_extensions = ["colon_fence"]

nitpicky = True  # every cross-reference must resolve (sphinx-build -n)
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the signatures show the defaults; the docstrings say the types
# each directive in api.md names the members it shows (Sphinx 9 lets a default "members" override
# a directive's own list)
autodoc_default_options: dict = {}
# the exported names' docstrings have Google-style "Args:" sections (PyTorch's and Accelerate's
# habit) and "Example::" literal blocks
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Names the docstrings mention that are not part of this API reference (torch's, Horovod's and
# internal types): nitpicky mode must not ask for pages of their own.
nitpick_ignore_regex = [
    ("py:.*", r"(torch|horovod|mpi4py|numpy|np|hvd|MPI)\b.*"),
]

html_theme = "furo"
html_title = "bno-hvd"
