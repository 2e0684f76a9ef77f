"""Content identity over a run (rollouts JSONL + recording) against sha256sum on the same files,
memory in a fresh process; then the re-export check (SKIPPED) against rehashing."""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.common import Row, best_of, make_run, mb, run_measured, sha256sum_seconds


def run(tiny: bool) -> list[Row]:
    size = 5_000_000 if tiny else 500_000_000
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gymart-bench-id-") as tmp_name:
        tmp = Path(tmp_name)
        out = make_run(tmp / "run", size, size)
        rollouts = out
        recording = tmp / "run" / "run_artifacts" / "recording.mp4"
        from gym_artifacts.run.identity import hash_bytes_file, hash_jsonl_file

        cases = [
            ("bytes", recording, "recording", hash_bytes_file, 1.5),
            ("JSONL", rollouts, "rollouts", hash_jsonl_file, 0.5),
        ]
        for kind, fpath, what, hasher, target in cases:
            size_bytes = fpath.stat().st_size
            sha = sha256sum_seconds(fpath)
            ours = best_of(lambda f=fpath, h=hasher: h(f), 2)
            rows.append(
                Row(
                    f"identity: {kind} ({mb(size_bytes)} {what})",
                    f"{size_bytes / ours / 1e6:,.0f} MB/s",
                    f"sha256sum {size_bytes / sha / 1e6:,.0f} MB/s",
                    sha / ours,
                    f">= {target}x sha256sum",
                    sha / ours >= target,
                )
            )
        base = run_measured("import gym_artifacts.run.identity")
        used = run_measured(
            "from gym_artifacts.run.identity import content_identities\n"
            "from gym_artifacts.run.artifacts import RunArtifacts\n"
            f"content_identities(RunArtifacts.from_path({str(out)!r}), use_cache=False)"
        )
        delta = used["peak_rss_mb"] - base["peak_rss_mb"]
        rows.append(
            Row(
                "identity: peak memory over import",
                f"+{delta:.0f} MB",
                f"import {base['peak_rss_mb']:.0f} MB",
                None,
                "constant in file size",
                delta < 64,
                used["peak_rss_mb"],
            )
        )
        small = make_run(tmp / "small", size // 100, size // 100)
        rows.extend(_reexport(tmp, out, small))
    return rows


def _skip_seconds(tmp: Path, out: Path) -> float:
    """Best of 5 SKIPPED re-exports of ``out`` (exported once first)."""
    from omegaconf import OmegaConf

    from gym_artifacts import export_run

    cfg = OmegaConf.create(
        {"exporters": {"local": {"enabled": True, "root": str(tmp / "store"), "report": "off"}}}
    )
    [first] = export_run(out, cfg)
    assert first.status.value == "EXPORTED", first.reason
    skip = best_of(lambda: export_run(out, cfg), 5)
    [again] = export_run(out, cfg)
    assert again.status.value == "SKIPPED", again.reason
    return skip


def _reexport(tmp: Path, out: Path, small: Path) -> list[Row]:
    from gym_artifacts.run.artifacts import RunArtifacts
    from gym_artifacts.run.identity import content_identities

    skip, skip_small = _skip_seconds(tmp, out), _skip_seconds(tmp, small)
    rehash = best_of(lambda: content_identities(RunArtifacts.from_path(out), use_cache=False), 2)
    total = sum(p.stat().st_size for p in RunArtifacts.from_path(out).artifact_files().values())
    return [
        Row(
            f"re-export: SKIPPED check ({mb(total)})",
            f"{skip * 1000:.1f} ms; a run 1/100 its size {skip_small * 1000:.1f} ms",
            f"rehash {rehash * 1000:.0f} ms",
            rehash / skip,
            "<= 5 ms, O(1) in rollouts (<= 1.5x the small run's)",
            skip <= 0.005 and skip <= 1.5 * skip_small,
        )
    ]
