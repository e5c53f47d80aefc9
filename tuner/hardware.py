"""GPU kinds (datasheet figures kept in one table) and the cluster a study runs on."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import UserError

GIB = 1024**3


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuSpec:
    """One GPU kind, from its vendor datasheet (dense, no sparsity)."""

    name: str
    """Short name used on the command line and in recipe names."""
    memory_gib: float
    """Device memory as the driver reports it, in GiB."""
    bf16_tflops: float
    """Dense bf16 tensor-core peak, TFLOP/s."""
    hbm_tb_s: float
    """Memory bandwidth, TB/s."""
    nvlink_gb_s: float
    """NVLink bandwidth per GPU, one direction, GB/s."""
    pcie_gb_s: float
    """Host link per GPU, one direction, GB/s (offload traffic)."""
    internode_gb_s: float
    """Network bandwidth per GPU across nodes, one direction, GB/s (one 400 Gb/s NIC per GPU)."""


GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        # H100 SXM5 80 GB: 989 TFLOP/s bf16, 3.35 TB/s, NVLink4 900 GB/s bidirectional.
        GpuSpec(
            name="h100",
            memory_gib=79.6,
            bf16_tflops=989.0,
            hbm_tb_s=3.35,
            nvlink_gb_s=450.0,
            pcie_gb_s=64.0,
            internode_gb_s=50.0,
        ),
        # H200 SXM 141 GB: H100 compute, 4.8 TB/s HBM3e.
        GpuSpec(
            name="h200",
            memory_gib=140.4,
            bf16_tflops=989.0,
            hbm_tb_s=4.8,
            nvlink_gb_s=450.0,
            pcie_gb_s=64.0,
            internode_gb_s=50.0,
        ),
        # H800 SXM5 80 GB: H100 compute and memory, NVLink cut to 400 GB/s bidirectional.
        GpuSpec(
            name="h800",
            memory_gib=79.6,
            bf16_tflops=989.0,
            hbm_tb_s=3.35,
            nvlink_gb_s=200.0,
            pcie_gb_s=64.0,
            internode_gb_s=50.0,
        ),
        # H20 96 GB: 148 TFLOP/s bf16, 4.0 TB/s, NVLink 900 GB/s bidirectional.
        GpuSpec(
            name="h20",
            memory_gib=95.0,
            bf16_tflops=148.0,
            hbm_tb_s=4.0,
            nvlink_gb_s=450.0,
            pcie_gb_s=64.0,
            internode_gb_s=50.0,
        ),
        # B200 (HGX) 180 GB: 2250 TFLOP/s dense bf16, 8 TB/s HBM3e, NVLink5 1.8 TB/s
        # bidirectional, PCIe Gen5 host link, one 400 Gb/s NIC per GPU.
        GpuSpec(
            name="b200",
            memory_gib=179.0,
            bf16_tflops=2250.0,
            hbm_tb_s=8.0,
            nvlink_gb_s=900.0,
            pcie_gb_s=64.0,
            internode_gb_s=50.0,
        ),
        # A100 SXM4 80 GB: 312 TFLOP/s bf16, 2.04 TB/s, NVLink3 600 GB/s bidirectional.
        GpuSpec(
            name="a100",
            memory_gib=79.2,
            bf16_tflops=312.0,
            hbm_tb_s=2.04,
            nvlink_gb_s=300.0,
            pcie_gb_s=32.0,
            internode_gb_s=25.0,
        ),
    )
}


def get_gpu(name: str) -> GpuSpec:
    key = name.lower()
    if key not in GPUS:
        raise UserError(f"unknown GPU kind {name!r}: use one of {', '.join(GPUS)}")
    return GPUS[key]


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """The GPUs one trial runs on."""

    gpu: GpuSpec
    """GPU kind, the same on every node."""
    num_gpus: int
    """GPUs the trial uses in all."""
    gpus_per_node: int = 8
    """GPUs in one node (NVLink domain)."""
    host_mem_gib: float | None = None
    """Host memory (CPU RAM) of one node, GiB; None: not known, so not checked
    (tuner.estimate.host_memory)."""

    def __post_init__(self) -> None:
        if self.gpus_per_node <= 0:
            raise UserError(f"--gpus-per-node must be positive, got {self.gpus_per_node}")
        if self.num_gpus <= 0:
            raise UserError(f"--gpus must be positive, got {self.num_gpus}")
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            raise UserError(
                f"--gpus {self.num_gpus} is not a multiple of --gpus-per-node "
                f"{self.gpus_per_node}: use whole nodes, e.g. --gpus "
                f"{self.num_gpus // self.gpus_per_node * self.gpus_per_node} or "
                f"{(self.num_gpus // self.gpus_per_node + 1) * self.gpus_per_node}"
            )

    @property
    def num_nodes(self) -> int:
        return max(1, self.num_gpus // self.gpus_per_node)

    @property
    def local_gpus(self) -> int:
        """GPUs per node actually used (fewer than gpus_per_node on a partial node)."""
        return min(self.num_gpus, self.gpus_per_node)

    @property
    def label(self) -> str:
        """`h100x32`, as recipe names use it."""
        return f"{self.gpu.name}x{self.num_gpus}"
