"""Services and their replicas in the daemon's SQLite store (tables `services`, `replicas`).

A service row holds its spec, its owner and its generation (bumped by each update); a replica
row ties one job of the pool to its service, its index, its port and the generation it runs. The
service manager keeps both in memory and writes each change through here, so a daemon killed at
any moment finds its services and re-adopts their replicas at restart.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from gpupool.agent.services import ServiceSpec
from gpupool.agent.store import Store
from gpupool.core.errors import GpupoolError, InvalidRequest


@dataclass(frozen=True)
class StoredService:
    spec: ServiceSpec
    uid: int
    user: str
    generation: int
    created_at: float


@dataclass(frozen=True)
class StoredReplica:
    job_id: int
    service: str
    index: int
    port: int
    generation: int


class ServiceStore:
    """The services' rows, over the daemon's store (each change one transaction)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def load(self) -> tuple[list[StoredService], list[StoredReplica]]:
        """Every service (a row that no longer parses is skipped) and every replica row."""
        with self._store.transaction() as db:
            rows = db.execute(
                "SELECT name, spec, uid, user, generation, created_at FROM services"
            ).fetchall()
            replicas = db.execute(
                "SELECT job_id, service, idx, port, generation FROM replicas"
            ).fetchall()
        services = []
        for row in rows:
            try:
                spec = ServiceSpec.from_json(json.loads(row["spec"]))
            except (ValueError, KeyError, TypeError, GpupoolError):
                continue
            services.append(
                StoredService(spec, row["uid"], row["user"], row["generation"], row["created_at"])
            )
        return services, [StoredReplica(*tuple(row)) for row in replicas]

    def add(self, spec: ServiceSpec, uid: int, user: str) -> StoredService:
        now = time.time()
        with self._store.transaction() as db:
            taken = db.execute("SELECT 1 FROM services WHERE name = ?", (spec.name,)).fetchone()
            if taken is not None:
                raise InvalidRequest(
                    f"service {spec.name} already exists: pick another name, or "
                    f"`gpupool service update {spec.name}`"
                )
            db.execute(
                "INSERT INTO services (name, spec, uid, user, generation, created_at) "
                "VALUES (?, ?, ?, ?, 1, ?)",
                (spec.name, json.dumps(spec.to_json()), uid, user, now),
            )
        return StoredService(spec, uid, user, 1, now)

    def update(self, spec: ServiceSpec, generation: int) -> None:
        with self._store.transaction() as db:
            db.execute(
                "UPDATE services SET spec = ?, generation = ? WHERE name = ?",
                (json.dumps(spec.to_json()), generation, spec.name),
            )

    def delete(self, name: str) -> None:
        with self._store.transaction() as db:
            db.execute("DELETE FROM services WHERE name = ?", (name,))

    def add_replica(self, replica: StoredReplica) -> None:
        with self._store.transaction() as db:
            db.execute(
                "INSERT INTO replicas (job_id, service, idx, port, generation) "
                "VALUES (?, ?, ?, ?, ?)",
                (
                    replica.job_id,
                    replica.service,
                    replica.index,
                    replica.port,
                    replica.generation,
                ),
            )

    def drop_replica(self, job_id: int) -> None:
        with self._store.transaction() as db:
            db.execute("DELETE FROM replicas WHERE job_id = ?", (job_id,))
