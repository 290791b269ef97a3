from .auto import AutoModelForDiffusionLM, add_diffusion_generation
from .convert import convert_checkpoint
from .diffusion_config import DiffusionConfig

__all__ = ["AutoModelForDiffusionLM", "DiffusionConfig", "add_diffusion_generation", "convert_checkpoint"]
