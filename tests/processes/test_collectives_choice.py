"""--collectives auto: which collectives a job gets, and why (bno_hvd/processes/world.py)."""

from bno_hvd.processes.world import choose_collectives, spins_cost_compute


def test_gloo_where_any_rank_would_spin_on_cpu_it_needs():
    assert choose_collectives([None, None, None, None])[0] == "mpi"
    choice, why = choose_collectives([None, None, "ranks run under a CPU limit", None])
    assert choice == "gloo" and "rank 2" in why


def test_cpu_limits_count_shared_cores_and_gpus_do_not(monkeypatch):
    import bno_hvd.processes.world as world

    monkeypatch.setattr(world, "usable_cores", lambda: 2)
    monkeypatch.setattr(world, "cpu_limit", lambda: None)
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    assert spins_cost_compute("cpu") is None  # 4 ranks on 2 cores, no limit: MPI (measured faster)
    assert spins_cost_compute("cpu", throttled=True) == "ranks run under a CPU limit"  # --cpu-quota
    monkeypatch.setattr(world, "cpu_limit", lambda: 0.5)  # a container's limit, set outside
    assert spins_cost_compute("cpu") == "ranks run under a CPU limit"
    assert spins_cost_compute("cuda") is None  # GPU tensors: not the CPU's collectives
    monkeypatch.setattr(world, "cpu_limit", lambda: 4.0)  # a limit above the cores it may use binds nothing
    assert spins_cost_compute("cpu") is None


def test_the_torch_engine_takes_gloo_for_gpu_tensors_when_asked(monkeypatch):
    import torch

    from bno_hvd.processes.torchworld import backend_for

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert [backend_for(d) for d in ("cpu", "cuda", "auto")] == ["gloo", "nccl", "nccl"]
    # several ranks on one GPU, or GPU ranks beside CPU ranks (the GPU check's shared GPU): NCCL cannot
    assert [backend_for(d, "gloo") for d in ("cpu", "cuda", "auto")] == ["gloo"] * 3
    assert backend_for("cuda", "mpi") == "nccl" and backend_for("auto", "auto") == "nccl"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert backend_for("auto") == "gloo"
