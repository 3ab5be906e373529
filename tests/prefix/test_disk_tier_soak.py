"""A short soak with the disk tier on: blocks spill and come back under load, and nothing is
left behind (requests, leases, Trio tasks, file descriptors, MLX memory), and the directory stays within
``cache.disk_mb``."""

from __future__ import annotations

import attrs
import pytest
import trio

from vllm_mlx_trio.bench.soak.run import SoakOptions, outcome_rows, run_soak
from vllm_mlx_trio.worker.prefix import disk_tier

pytestmark = pytest.mark.mlx

DISK_MB = 1


@pytest.mark.parametrize("mode", ["batched", "simple"])
async def test_a_short_soak_with_the_disk_tier_stays_in_budget_and_leaks_nothing(demo_cfg, tmp_path, mode, monkeypatch):
    disk = tmp_path / "disk"
    tiers, sizes = [], []  # the tier the runner opens; the directory's bytes after each write/delete
    real_init, real_do = disk_tier.DiskTier.__init__, disk_tier.DiskTier._do

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        tiers.append(self)

    def do(self, action, key_hex, host):
        real_do(self, action, key_hex, host)
        files = list(self.directory.glob("*.safetensors"))
        sizes.append((sum(p.stat().st_size for p in files), max((p.stat().st_size for p in files), default=0)))

    monkeypatch.setattr(disk_tier.DiskTier, "__init__", init)
    monkeypatch.setattr(disk_tier.DiskTier, "_do", do)
    cache = attrs.evolve(
        demo_cfg.cache, block_size=16, memory_aware=False, max_entries=8, disk_dir=str(disk), disk_mb=DISK_MB
    )  # a few entries in memory: most blocks spill, and hits read them back
    cfg = attrs.evolve(demo_cfg, cache=cache, engine=attrs.evolve(demo_cfg.engine, mode=mode))
    options = SoakOptions(requests=60, concurrency=4, max_tokens=4, warmup=20, refill=10, quiesce_timeout_s=30.0)
    with trio.fail_after(150):
        result = await run_soak(cfg, options)
    assert result.warmup.errors == [] and result.tally.errors == []
    failures = result.failures(rss_limit_mib=None)
    # no request, lease, task, fd or object left, and MLX active memory back to the baseline: the
    # writes still queued when the soak clears the cache (each holds its block's arrays) are dropped
    assert failures == [], failures
    rows = {row["kind"]: row for row in outcome_rows(result.tally)}
    assert rows["total"]["sent"] == 60 and rows["total"]["error"] == 0
    after, before = result.after, result.baseline
    assert after.cache_hits > before.cache_hits
    assert after.fds <= before.fds
    (tier,) = tiers
    assert tier.stats.num_spilled > 0 and tier.stats.num_hits > 0  # spilled, and read back
    assert tier.stats.num_evicted > 0  # the budget made it forget the oldest
    # within the budget, but for the one new file written before the oldest is deleted
    assert all(total - largest <= DISK_MB * 1024 * 1024 for total, largest in sizes)
    assert not list(disk.glob("*.safetensors"))  # the soak's cache clear emptied it
