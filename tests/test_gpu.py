"""What only a CUDA GPU runs: the encoder and the varlen attention kernels (nested tensors, flash-attn) on the
device, against references computed on the CPU. Marked ``gpu``: conftest.py skips them when torch sees no GPU.
(Written on CPU-only machines; `bench/gpu.sh` holds the GPU figures.)"""
import pytest
import torch

from test_models import HEADS, no_dropout, padded_batch, per_sample_attention
from trainer.models import MLM, PretrainingModel
from trainer.models.kernels import pack, varlen_attention

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("unpad", [False, True], ids=["padded", "unpadded"])
def test_encoder_on_gpu_gives_the_cpu_logits_in_fp32(unpad):
    cfg = no_dropout("tiny", unpad=unpad)
    torch.manual_seed(0)
    model = PretrainingModel(cfg, HEADS).eval()
    ids, mask, types = padded_batch(cfg)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        want = model(ids, mask, types)[MLM]
        got = model.cuda()(ids.cuda(), mask.cuda(), types.cuda())[MLM].cpu()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("method", ["nested", "flash"])
def test_varlen_attention_on_gpu_equals_per_sample_attention_in_bf16(method):
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    packing = pack(mask, torch.tensor([[1, 1, 2, 2, 2], [1, 1, 0, 0, 0], [1, 2, 2, 0, 0]]))
    qkv_dense = torch.randn(3, 5, 3, 2, 64)  # head dim 64: flash-attn's kernels want a multiple of 8
    ref = per_sample_attention(qkv_dense, [(0, 0, 2), (0, 2, 5), (1, 0, 2), (2, 0, 1), (2, 1, 3)])
    qkv = qkv_dense.reshape(15, 3, 2, 64)[packing.indices].to("cuda", torch.bfloat16)
    try:
        out = varlen_attention(qkv, packing.to("cuda"), method=method)
    except RuntimeError as err:
        if "needs flash-attn" in str(err):
            pytest.skip(str(err))
        raise
    torch.testing.assert_close(out.float().cpu(), ref, rtol=0, atol=3e-2)  # bf16 inputs: ~1e-2 rounding
