"""Training modes as tf-models-style Tasks, and the registry that maps task.type to them.

A new training mode is one module with a `RealmTask` subclass and one `register` line here.
"""
from typing import Optional, Type

from realm_tf.io.roles import HostRole

from realm_tf.tasks.base import RealmTask
from realm_tf.tasks.ict import IctTask
from realm_tf.tasks.openqa import OpenQATask
from realm_tf.tasks.pretrain import PretrainTask

_REGISTRY: dict[str, Type[RealmTask]] = {}


def register(task_type: str, task_cls: Type[RealmTask]):
  if task_type in _REGISTRY:
    raise ValueError(f"task type {task_type!r} is registered already")
  _REGISTRY[task_type] = task_cls


def task_class(task_type: str) -> Type[RealmTask]:
  if task_type not in _REGISTRY:
    raise ValueError(f"unknown task type {task_type!r}; registered: {sorted(_REGISTRY)}")
  return _REGISTRY[task_type]


def get_task(experiment, model_dir: str = "", start_step: int = 0,
             role: Optional[HostRole] = None) -> RealmTask:
  """The task object for experiment.task.type, holding the selected task config; `role`:
  this process's part in a multi-process job (default: the only process)."""
  cls = task_class(experiment.task.type)
  return cls(experiment.task_config, experiment=experiment, model_dir=model_dir,
             start_step=start_step, name=experiment.task.type, role=role)


register("ict", IctTask)
register("pretrain", PretrainTask)
register("openqa", OpenQATask)

__all__ = ["IctTask", "OpenQATask", "PretrainTask", "RealmTask", "get_task", "register",
           "task_class"]
