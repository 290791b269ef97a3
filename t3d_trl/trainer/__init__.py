from .t3d_config import T3DConfig
from .t3d_trainer import T3DTrainer

__all__ = ["T3DConfig", "T3DTrainer"]
