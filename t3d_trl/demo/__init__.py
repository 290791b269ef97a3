"""The embedded demo: generated task families and the tiny teacher model they are learnt by."""

from .tasks import DEMO_TASKS, DemoTask, build_teacher, get_task, teacher_config

__all__ = ["DEMO_TASKS", "DemoTask", "build_teacher", "get_task", "teacher_config"]
