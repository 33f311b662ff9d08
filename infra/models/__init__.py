"""Models the stack, the planner and the local cluster size for: one ``Model``, described by a
preset, by hand (``custom``), or from a GGUF header (``infra.models.gguf``, which needs the gguf
package)."""

from infra.models.model import Model, ModelError, custom, resized
from infra.models.presets import PRESETS, preset

__all__ = ["PRESETS", "Model", "ModelError", "custom", "preset", "resized"]
