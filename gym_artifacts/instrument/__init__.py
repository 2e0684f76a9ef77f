"""NeMo Gym logging through gym-artifacts without editing NeMo Gym: the two routes.

* ``command``: ``gym-artifacts instrument -- COMMAND`` runs a program (``gym eval run ...``) with
  NeMo Gym's exporter module replaced by ``gym_artifacts.nemo_gym`` in it and in every Python
  process it starts (the start-up hook in ``startup/``);
* ``entry_point``: the exporter class registered under the entry-point group NeMo Gym proposes
  for exporter plugins (``nemo_gym.exporters``, NVIDIA-NeMo/Gym issue #2989), for a NeMo Gym that
  discovers its exporters there.

Import-light: nothing is loaded until a route is used.
"""
