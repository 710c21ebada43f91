"""The ``verl`` trainer backend: our training samples in verl's batch layout, verl's config for one multi-GPU node.

- :mod:`.data`: :class:`~agentbolt.adapter.samples.TrainingSample` lists <-> verl's left/right-padded actor
  batch, and verl generation output -> :class:`~agentbolt.types.Transition` (pure, torch only, CPU-tested).
- :mod:`.config`: :class:`~.config.VerlTrainerConfig`, checked against the divisibility rules verl enforces, and
  its hydra overrides for verl's ``ppo_trainer`` config (pure, CPU-tested).
- :mod:`.trainer`: the :class:`~agentbolt.trainer.loop.PolicyUpdater` that calls verl's actor update. GPU only;
  imports verl lazily; never run in this repository's tests.

Importing this package imports torch and pydantic, never verl.
"""
