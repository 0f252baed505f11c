"""Training modes as tf-models-style Tasks, and the registry that maps task.type to them.

A new training mode is three things: one module here with its `RealmTask` subclass, one
`register` line below, and its settings, a TaskConfig held by a field of TaskSelection
(realm_tf.configs.experiment) named by the task type; task.type's choices follow those
fields, and `register` refuses a type without one.
"""
from typing import Optional, Type

from realm_tf.configs.experiment import TASK_TYPES
from realm_tf.io.roles import HostRole

from realm_tf.tasks.base import RealmTask
from realm_tf.tasks.ict import IctTask
from realm_tf.tasks.openqa import OpenQATask
from realm_tf.tasks.pretrain import PretrainTask

_REGISTRY: dict[str, Type[RealmTask]] = {}


def register(task_type: str, task_cls: Type[RealmTask]):
  """Makes `task_cls` the task of task.type = `task_type`.

  Args:
    task_type: the config's task.type (and the TaskSelection field of its config).
    task_cls: the RealmTask subclass.

  Raises:
    ValueError: `task_type` is registered already, or TaskSelection has no field of that
      name for its settings.
  """
  if task_type in _REGISTRY:
    raise ValueError(f"task type {task_type!r} is registered already")
  if task_type not in TASK_TYPES:
    raise ValueError(f"task type {task_type!r} has no settings: add a field {task_type} to "
                     f"TaskSelection (realm_tf.configs.experiment); it has {TASK_TYPES}")
  _REGISTRY[task_type] = task_cls


def task_class(task_type: str) -> Type[RealmTask]:
  """The RealmTask subclass registered for `task_type`.

  Raises:
    ValueError: nothing is registered for it.
  """
  if task_type not in _REGISTRY:
    raise ValueError(f"unknown task type {task_type!r}; registered: {sorted(_REGISTRY)}")
  return _REGISTRY[task_type]


def get_task(experiment, model_dir: str = "", start_step: int = 0,
             role: Optional[HostRole] = None) -> RealmTask:
  """The task object for experiment.task.type, holding the selected task config.

  Args:
    experiment: the run's ExperimentConfig.
    model_dir: the run's directory ('' for no run).
    start_step: the step a resumed run starts from (inputs skip what was consumed).
    role: this process's part in a multi-process job (default: the only process).

  Returns:
    An IctTask, PretrainTask or OpenQATask (RealmTask).

  Raises:
    ValueError: task.type is not registered.
  """
  cls = task_class(experiment.task.type)
  return cls(experiment.task_config, experiment=experiment, model_dir=model_dir,
             start_step=start_step, name=experiment.task.type, role=role)


register("ict", IctTask)
register("pretrain", PretrainTask)
register("openqa", OpenQATask)

__all__ = ["IctTask", "OpenQATask", "PretrainTask", "RealmTask", "get_task", "register",
           "task_class"]
