"""Device time of each kernel (torch.profiler / CUPTI) for the routes at the main shapes, to split a
benchmark figure into kernel time and launch gaps. Needs a CUDA GPU; prints one table."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

import qgate_kernels


def main() -> None:
    dev = "cuda"

    def pair(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, k, device=dev).half(), torch.randn(k, device=dev).half()

    sets = [pair(3072, 2048) for _ in range(22)]  # 277 MB: each call reads its weights from HBM
    big = [pair(4096, 4096) for _ in range(8)]
    scores = [torch.randn(1, 131072, device=dev) for _ in range(64)]
    visible = torch.full((1,), 131072, dtype=torch.int32, device=dev)
    for w, x in sets + big:
        qgate_kernels.gemv(w, x)
    for s in scores:
        qgate_kernels.qsa_topk(s, visible, 2048)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            for w, x in sets + big:
                qgate_kernels.gemv(w, x)
            for s in scores:
                qgate_kernels.qsa_topk(s, visible, 2048)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
