"""Where ``lrc``'s own files are: the boot files (``cloud-init/``), the shipped stacks
(``stacks/``) and the Pulumi project (``Pulumi.yaml``). In a checkout, and an editable install of
one, they sit beside ``infra/``; an installed wheel carries a copy of them inside the package,
under ``infra/_files/`` (``pyproject.toml``'s force-include), so that ``uv tool install .`` or
``pipx install`` gives an ``lrc`` that boots nodes and reads the shipped stacks from anywhere.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # infra/
CHECKOUT = PACKAGE.parent
INSTALLED = PACKAGE / "_files"
# The directory with this lrc's own cloud-init/, stacks/ and Pulumi.yaml.
OWN_FILES = CHECKOUT if (CHECKOUT / "cloud-init").is_dir() else INSTALLED
