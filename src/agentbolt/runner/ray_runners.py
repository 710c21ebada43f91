"""Runner fan-out on Ray: one Ray actor per runner, each a client of the agentbolt server at ``store_url``.

Each actor imports the agent by ``"package.module:attribute"`` (:func:`~agentbolt.runner.processes.load_agent`),
builds its own :class:`~agentbolt.client.HttpLightningStore` (with the bearer token, if any) and runs one
:class:`~agentbolt.runner.worker.Runner` with ``concurrency`` slots until the pool stops it or, with ``exit_after``,
until that many of its own attempts ended. Spans go to the server over OTLP/HTTP, as from any runner process, so
the actors need only network access to the server: no shared file system, no Ray object passing.

Ray is imported only inside functions, so ``import agentbolt.runner`` works without it; a missing Ray raises
``ConfigError`` naming ``pip install 'agentbolt[ray]'``. The agent must be importable in the actors: on a local Ray
the pool's ``python_path`` folders are enough; on a cluster, ship the code with ``runtime_env`` (``working_dir``,
``py_modules`` or ``pip``).

    pool = RayRunnerPool("my_pkg.agents:calc_agent", "http://10.0.0.5:8765", runners=4, concurrency=2)
    pool.start()        # Ray up (local unless ray_address), actors placed, agent loaded, server reached
    ...
    stats = pool.stop() # in-flight attempts finish, then the actors end; returns the summed RunnerStats
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from agentbolt.errors import AgentboltError, BackendError, ConfigError

if TYPE_CHECKING:
    from agentbolt.client import HttpLightningStore
    from agentbolt.runner.worker import Runner, RunnerStats

logger = logging.getLogger(__name__)

RAY_INSTALL_HINT = "pip install 'agentbolt[ray]'"


def import_ray() -> ModuleType:
    """Import Ray.

    Raises:
        ConfigError: Ray is not installed (the message says ``pip install 'agentbolt[ray]'``).
    """
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"Ray runners need Ray, which is not installed: {RAY_INSTALL_HINT}") from exc
    return ray


def sum_stats(parts: Sequence[RunnerStats]) -> RunnerStats:
    """Field-by-field sum of runner counters."""
    from agentbolt.runner.worker import RunnerStats

    total = RunnerStats()
    for part in parts:
        for field in dataclasses.fields(RunnerStats):
            setattr(total, field.name, getattr(total, field.name) + getattr(part, field.name))
    return total


class RunnerActor:
    """The body of one Ray runner actor (wrapped with ``ray.remote`` by :class:`RayRunnerPool`; async actor).

    Args:
        agent: ``"package.module:attribute"``.
        store_url: the agentbolt server's ``http(s)://`` root.
        token: bearer token of the server, or None.
        worker_id: the name this runner reports to the store.
        concurrency: rollouts run at once.
        exit_after: end :meth:`run` after this many attempts of this actor ended (None: until :meth:`stop`).
        python_path: folders appended to ``sys.path`` before the agent is imported.
        instrument: as :class:`~agentbolt.runner.worker.Runner`'s ``instrument``.
    """

    def __init__(
        self,
        agent: str,
        store_url: str,
        token: str | None,
        worker_id: str,
        concurrency: int,
        exit_after: int | None,
        python_path: Sequence[str],
        instrument: bool | Sequence[str],
    ) -> None:
        for entry in python_path:
            if entry not in sys.path:
                sys.path.append(entry)
        logging.basicConfig(level=logging.WARNING)
        self.agent_ref = agent
        self.store_url = store_url
        self.token = token
        self.worker_id = worker_id
        self.concurrency = concurrency
        self.exit_after = exit_after
        self.instrument: bool | list[str] = instrument if isinstance(instrument, bool) else list(instrument)
        self._stop = False
        self._runner: Runner | None = None
        self._store: HttpLightningStore | None = None

    async def setup(self) -> str:
        """Import the agent, reach the server (a worker heartbeat); returns the worker id.

        Raises:
            ConfigError: bad agent reference, or a store URL that is not ``http(s)://``.
            BackendError: the server cannot be reached.
        """
        from agentbolt.client import HttpLightningStore
        from agentbolt.runner.processes import load_agent
        from agentbolt.runner.worker import Runner

        agent = load_agent(self.agent_ref)
        store = HttpLightningStore(self.store_url, token=self.token)
        try:
            await store.heartbeat(self.worker_id)
        except BaseException:
            await store.close()
            raise
        self._store = store
        self._runner = Runner(
            agent, store, worker_id=self.worker_id, concurrency=self.concurrency, instrument=self.instrument
        )
        return self.worker_id

    async def run(self) -> RunnerStats:
        """Run the runner until :meth:`stop` or ``exit_after``; returns its counters. Call :meth:`setup` first.

        Raises:
            FrameworkUnavailable / ConfigError: as :meth:`Runner.run <agentbolt.runner.worker.Runner.run>`.
        """
        runner = self._runner
        if runner is None:
            raise ConfigError("RunnerActor.run called before setup")

        def stopped() -> bool:
            ended = runner.stats.succeeded + runner.stats.failed
            return self._stop or (self.exit_after is not None and ended >= self.exit_after)

        try:
            return await runner.run(stop=stopped)
        finally:
            if self._store is not None:
                await self._store.close()

    async def stop(self) -> None:
        """Ask the runner to stop: no new claims; attempts in flight finish and are reported."""
        self._stop = True

    async def stats(self) -> RunnerStats:
        """This runner's counters so far."""
        from agentbolt.runner.worker import RunnerStats

        return dataclasses.replace(self._runner.stats) if self._runner is not None else RunnerStats()


def _reraise(exc: BaseException) -> BaseException:
    """The error to show for a failed actor call: the agentbolt error it raised, else a BackendError."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, AgentboltError):
        return cause
    return BackendError(f"a Ray runner actor failed: {cause if isinstance(cause, BaseException) else exc!r}")


class RayRunnerPool:
    """``runners`` Ray actors, each running one :class:`~agentbolt.runner.worker.Runner` against ``store_url``.

    Args:
        agent: the agent as ``"package.module:attribute"`` (imported in each actor).
        store_url: the agentbolt server's ``http(s)://`` root, reachable from every Ray node.
        runners: number of actors (runners), >= 1.
        concurrency: rollouts each runner runs at once, >= 1 (so ``runners * concurrency`` in all).
        token: the server's bearer token, or None.
        exit_after: each runner ends after this many of its attempts ended (succeeded or failed), >= 1; None: run
            until :meth:`stop`. Per runner, like ``agentbolt run --exit-after``, not a pool total.
        ray_address: the Ray cluster to connect to (``"auto"``, ``"ray://host:10001"``...); None: the running Ray
            of this process if :func:`ray.init` was called, else a new local Ray (or ``RAY_ADDRESS`` if set).
        runtime_env: Ray runtime environment of the actors (e.g. ``{"working_dir": "."}`` on a cluster).
        python_path: folders appended to ``sys.path`` in each actor before the agent is imported (local Ray).
        instrument: as :class:`~agentbolt.runner.worker.Runner`'s ``instrument``.
        num_cpus: CPUs Ray reserves per actor; None: Ray's default for actors.
        worker_prefix: worker ids are ``<worker_prefix>-<i>-<hex>``, one hex per pool.
        ray_init: extra keyword arguments to :func:`ray.init` when the pool starts Ray.

    Raises:
        ConfigError: a count below 1 (here); at :meth:`start`, Ray missing or a bad agent reference.
    """

    def __init__(
        self,
        agent: str,
        store_url: str,
        *,
        runners: int = 2,
        concurrency: int = 1,
        token: str | None = None,
        exit_after: int | None = None,
        ray_address: str | None = None,
        runtime_env: Mapping[str, object] | None = None,
        python_path: Sequence[str] = (),
        instrument: bool | Sequence[str] = True,
        num_cpus: float | None = None,
        worker_prefix: str = "ray",
        ray_init: Mapping[str, object] | None = None,
    ) -> None:
        for name, value in (("runners", runners), ("concurrency", concurrency), ("exit_after", exit_after)):
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        self.agent = agent
        self.store_url = store_url
        self.runners = runners
        self.concurrency = concurrency
        self.token = token
        self.exit_after = exit_after
        self.ray_address = ray_address
        self.runtime_env = dict(runtime_env) if runtime_env else None
        self.python_path = list(python_path)
        self.instrument: bool | list[str] = instrument if isinstance(instrument, bool) else list(instrument)
        self.num_cpus = num_cpus
        self.ray_init = dict(ray_init or {})
        suffix = uuid.uuid4().hex[:6]
        self.worker_ids = [f"{worker_prefix}-{i}-{suffix}" for i in range(runners)]
        self._actors: list[Any] = []  # ray.actor.ActorHandle of RunnerActor
        self._runs: list[Any] = []  # ray.ObjectRef of each RunnerActor.run
        self._owns_ray = False
        self._started = False
        self._final: RunnerStats | None = None

    def start(self, timeout_s: float = 120.0) -> None:
        """Start Ray if needed, place the actors, import the agent and reach the server in each, then run them.

        Raises:
            ConfigError: Ray is not installed, or the agent reference is bad (raised in an actor).
            BackendError: the server cannot be reached from an actor, or an actor died.
            TimeoutError: the actors were not all set up within ``timeout_s`` (e.g. too few CPUs for ``num_cpus``).
        """
        if self._started:
            raise ConfigError("this RayRunnerPool was already started; make a new one")
        self._started = True
        ray = import_ray()
        if not ray.is_initialized():
            ray.init(address=self.ray_address, **self.ray_init)
            self._owns_ray = True
        options: dict[str, object] = {"max_restarts": 0}
        if self.runtime_env is not None:
            options["runtime_env"] = self.runtime_env
        if self.num_cpus is not None:
            options["num_cpus"] = self.num_cpus
        actor_cls = ray.remote(RunnerActor).options(**options)
        self._actors = [
            actor_cls.remote(
                self.agent,
                self.store_url,
                self.token,
                worker_id,
                self.concurrency,
                self.exit_after,
                self.python_path,
                self.instrument,
            )
            for worker_id in self.worker_ids
        ]
        try:
            self._get([a.setup.remote() for a in self._actors], timeout_s)
        except BaseException:
            self._kill_all()
            if self._owns_ray:
                ray.shutdown()
                self._owns_ray = False
            raise
        self._runs = [a.run.remote() for a in self._actors]

    def done(self) -> bool:
        """True once every runner ended (``exit_after`` reached, stopped, or failed)."""
        if not self._runs:
            return True
        ray = import_ray()
        ready, _ = ray.wait(self._runs, num_returns=len(self._runs), timeout=0)
        return len(ready) == len(self._runs)

    def wait(self, timeout_s: float | None = None) -> RunnerStats:
        """Block until every runner ended (``exit_after`` or :meth:`stop`); returns the summed counters.

        Raises:
            TimeoutError: not all ended within ``timeout_s`` (the runners keep running).
            AgentboltError: an actor's runner raised (e.g. ``FrameworkUnavailable``); BackendError if it died.
        """
        if self._final is not None:
            return self._final
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.done():  # short waits, so Ctrl-C and signal handlers run in between
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"Ray runners still running after {timeout_s} s")
            time.sleep(0.1)
        return sum_stats(self._get(self._runs, None))

    def stats(self) -> RunnerStats:
        """The counters of all runners so far, summed (the final ones after :meth:`stop`)."""
        if self._final is not None:
            return self._final
        if not self._actors:
            return sum_stats([])
        return sum_stats(self._get([a.stats.remote() for a in self._actors], 30.0))

    def stop(self, timeout_s: float = 60.0) -> RunnerStats:
        """Stop claiming; let attempts in flight finish (up to ``timeout_s``), then end the actors (and the Ray
        this pool started). Returns the summed final counters. Idempotent.

        Actors still busy after ``timeout_s`` are killed; their attempts are left to the store's heartbeat timeout.
        An actor whose runner raised is logged, and its counters are left out.
        """
        if self._final is not None:
            return self._final
        parts: list[RunnerStats] = []
        if self._runs:
            ray = import_ray()
            for actor in self._actors:
                actor.stop.remote()
            ready, pending = ray.wait(self._runs, num_returns=len(self._runs), timeout=timeout_s)
            if pending:
                logger.warning("%d Ray runners did not stop within %.0f s; killing them", len(pending), timeout_s)
            for ref in ready:
                try:
                    parts.append(ray.get(ref))
                except Exception as exc:
                    logger.warning("a Ray runner ended with an error: %s", _reraise(exc))
        self._final = sum_stats(parts)
        if self._actors:
            self._kill_all()
        if self._owns_ray:
            import_ray().shutdown()
            self._owns_ray = False
        return self._final

    def __enter__(self) -> RayRunnerPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _get(self, refs: list[Any], timeout_s: float | None) -> list[RunnerStats]:
        ray = import_ray()
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        try:
            return ray.get(refs, timeout=timeout_s)
        except GetTimeoutError as exc:
            raise TimeoutError(
                f"Ray runner actors did not answer within {timeout_s} s (too few free CPUs for {self.runners} "
                "actors? see num_cpus)"
            ) from exc
        except RayTaskError as exc:
            raise _reraise(exc) from None
        except RayActorError as exc:
            raise BackendError(f"a Ray runner actor died: {exc}") from exc

    def _kill_all(self) -> None:
        ray = import_ray()
        for actor in self._actors:
            try:
                ray.kill(actor)
            except Exception as exc:  # already gone
                logger.debug("could not kill a Ray runner actor: %r", exc)
        self._actors = []
        self._runs = []
