from .auto import AutoModelForDiffusionLM, add_diffusion_generation
from .diffusion_config import DiffusionConfig

__all__ = ["AutoModelForDiffusionLM", "DiffusionConfig", "add_diffusion_generation"]
