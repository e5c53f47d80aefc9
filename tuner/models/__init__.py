"""Model architectures, the names of the modules below re-exported once.

- `spec`: `ModelSpec`, an architecture, with its parameter counts and FLOP formulas.
- `hf_config`: the reader of a Hugging Face config.json (each value checked first).
- `registry`: the models known by name, and `get_model` (a name or a config.json's path).
"""

from tuner.models.hf_config import (
    CONFIG_COUNTS,
    CONFIG_FLAGS,
    CONFIG_MAX_BYTES,
    CONFIG_TEXTS,
    MAX_COUNT,
    MAX_LAYERS,
    QK_NORM_MODEL_TYPES,
    QKV_BIAS_MODEL_TYPES,
    check_config_values,
    from_hf_config,
    model_name_of,
    path_kind,
)
from tuner.models.registry import REGISTRY, get_model, spec_fields
from tuner.models.spec import MIN_VOCAB, ModelSpec

__all__ = [
    "CONFIG_COUNTS",
    "CONFIG_FLAGS",
    "CONFIG_MAX_BYTES",
    "CONFIG_TEXTS",
    "MAX_COUNT",
    "MAX_LAYERS",
    "MIN_VOCAB",
    "QKV_BIAS_MODEL_TYPES",
    "QK_NORM_MODEL_TYPES",
    "REGISTRY",
    "ModelSpec",
    "check_config_values",
    "from_hf_config",
    "get_model",
    "model_name_of",
    "path_kind",
    "spec_fields",
]
