"""Bytes as exact float32 integers, for moving arbitrary data through the engine's fp32 average.

A tensor's bytes are cut into little-endian 16-bit words (8-bit from 257 ranks up), each held as a float32
integer. Multiplied by the world size P on the rank that owns them and 0 elsewhere, every partial sum of a ring
average stays an integer below 2^24, the division by P is exact, and every rank gets the owner's bytes bit for
bit, whatever the dtype. Used by gradex.torch.collectives (broadcasts, gathers) and gradex.torchft (the process
group's exact collectives).
"""
from __future__ import annotations

import torch


def word_bits(world: int) -> int:
    """Bits per word for `world` ranks: 16 up to 256 ranks (P * 65535 < 2^24), else 8."""
    return 16 if world <= 256 else 8


def to_words(data: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 tensor -> float32 tensor of its little-endian 16-bit (or 8-bit) words, as integers."""
    data = data.reshape(-1)
    if bits == 8:
        return data.to(torch.float32)
    if data.numel() % 2:
        data = torch.cat([data, data.new_zeros(1)])
    words = data[0::2].to(torch.int32) | (data[1::2].to(torch.int32) << 8)
    return words.to(torch.float32)


def from_words(words: torch.Tensor, bits: int, nbytes: int) -> torch.Tensor:
    """The first `nbytes` bytes that to_words(…, bits) turned into `words`."""
    w = words.to(torch.int32)
    if bits == 8:
        return w.to(torch.uint8)[:nbytes]
    out = torch.empty(2 * w.numel(), dtype=torch.uint8)
    out[0::2] = (w & 0xFF).to(torch.uint8)
    out[1::2] = (w >> 8).to(torch.uint8)
    return out[:nbytes]
