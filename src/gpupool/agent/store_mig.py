"""The store's MIG rows: the instance of each MIG job, noted before it is created."""

from __future__ import annotations

from gpupool.agent.jobs import MigUse
from gpupool.agent.store_db import Database


class MigInstances(Database):
    """The MIG instance of each MIG job (table `mig_instances`)."""

    def mig_intend(self, job_id: int, gpu: int, profile: str, start: int) -> None:
        """Note, before creating it, the instance the daemon is about to create for a job."""
        with self.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO mig_instances (job_id, gpu, profile, start, created) "
                "VALUES (?, ?, ?, ?, 1)",
                (job_id, gpu, profile, start),
            )

    def mig_assign(self, job_id: int, use: MigUse) -> None:
        """The job's instance, existing (created or found free)."""
        with self.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO mig_instances "
                "(job_id, gpu, profile, start, gi_id, uuid, memory, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    use.gpu,
                    use.profile,
                    use.start,
                    use.gi_id,
                    use.uuid,
                    use.memory_total,
                    int(use.created),
                ),
            )

    def mig_rows(
        self, *, released: bool = False
    ) -> list[tuple[int, MigUse | None, tuple[int, str, int]]]:
        """The instances jobs hold (with `released`, also those they held): job id, its
        instance (None while only intended), (gpu, profile, start)."""
        with self._using("read") as db:
            rows = db.execute(
                "SELECT job_id, gpu, profile, start, gi_id, uuid, memory, created "
                "FROM mig_instances WHERE released = 0 OR ? ORDER BY job_id",
                (int(released),),
            ).fetchall()
        found = []
        for r in rows:
            use = None
            if r["uuid"] is not None:
                use = MigUse(
                    r["gpu"],
                    r["gi_id"],
                    r["profile"],
                    r["start"],
                    r["uuid"],
                    r["memory"],
                    bool(r["created"]),
                )
            found.append((r["job_id"], use, (r["gpu"], r["profile"], r["start"])))
        return found

    def mig_uses(self, *, released: bool = False) -> dict[int, MigUse]:
        """The instance of each job that holds one (with `released`: or held one)."""
        rows = self.mig_rows(released=released)
        return {job_id: use for job_id, use, _ in rows if use is not None}

    def mig_release(self, job_id: int) -> None:
        """The job is done with its instance; the row stays, so `ps -a` still names it."""
        with self.transaction() as db:
            db.execute("UPDATE mig_instances SET released = 1 WHERE job_id = ?", (job_id,))

    def mig_forget(self, job_id: int) -> None:
        """An intended instance that was never made for the job."""
        with self.transaction() as db:
            db.execute("DELETE FROM mig_instances WHERE job_id = ?", (job_id,))
