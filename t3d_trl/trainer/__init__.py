from .callbacks import EvaluateAtSteps
from .t3d_config import T3DConfig
from .t3d_trainer import T3DTrainer

__all__ = ["EvaluateAtSteps", "T3DConfig", "T3DTrainer"]
