#!/usr/bin/env python3
"""A tiny vision projector GGUF for llama.cpp's llama-server (--mmproj),
made without torch or numpy (not installed here): a LLaVA-style CLIP
encoder (projector type "mlp": a ViT of 2 blocks over 16x16 patches of a
32x32 image, then a 2-layer MLP) whose weights are random, written as
GGUF v3 by hand.

    bench/make-tiny-mmproj.py OUT.gguf [TEXT_N_EMBD]   (default 64: stories260K)

Its output means nothing; it exists so that a llama-server with a
projector can be run here (bench/llama-server-vision.sh): it loads, takes
an image through /v1/chat/completions, and answers. TEXT_N_EMBD must be
the text model's embedding width (the projector's output).
"""
import random
import struct
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "mmproj-tiny.gguf"
n_text = int(sys.argv[2]) if len(sys.argv) > 2 else 64
n_embd, n_ff, n_layer, n_head, image, patch = 32, 64, 2, 2, 32, 16
n_pos = (image // patch) ** 2 + 1  # the patches and the class embedding

T_U32, T_F32, T_BOOL, T_STR, T_ARR = 4, 6, 7, 8, 9


def s(v):
    b = v.encode()
    return struct.pack("<Q", len(b)) + b


kv = [
    ("general.architecture", T_STR, "clip"),
    ("general.name", T_STR, "tiny random projector (spillway bench)"),
    ("clip.projector_type", T_STR, "mlp"),
    ("clip.has_vision_encoder", T_BOOL, True),
    ("clip.use_gelu", T_BOOL, True),
    ("clip.vision.image_size", T_U32, image),
    ("clip.vision.patch_size", T_U32, patch),
    ("clip.vision.embedding_length", T_U32, n_embd),
    ("clip.vision.feed_forward_length", T_U32, n_ff),
    ("clip.vision.block_count", T_U32, n_layer),
    ("clip.vision.projection_dim", T_U32, n_text),
    ("clip.vision.attention.head_count", T_U32, n_head),
    ("clip.vision.attention.layer_norm_epsilon", T_F32, 1e-5),
    ("clip.vision.image_mean", T_ARR, [0.5, 0.5, 0.5]),
    ("clip.vision.image_std", T_ARR, [0.5, 0.5, 0.5]),
]

tensors = [  # name, ne (innermost first)
    ("v.patch_embd.weight", [patch, patch, 3, n_embd]),
    ("v.class_embd", [n_embd]),
    ("v.position_embd.weight", [n_embd, n_pos]),
]
for i in range(n_layer):
    for t in ("attn_q", "attn_k", "attn_v", "attn_out"):
        tensors += [("v.blk.%d.%s.weight" % (i, t), [n_embd, n_embd]),
                    ("v.blk.%d.%s.bias" % (i, t), [n_embd])]
    for t in ("ln1", "ln2"):
        tensors += [("v.blk.%d.%s.weight" % (i, t), [n_embd]),
                    ("v.blk.%d.%s.bias" % (i, t), [n_embd])]
    tensors += [("v.blk.%d.ffn_up.weight" % i, [n_embd, n_ff]),
                ("v.blk.%d.ffn_up.bias" % i, [n_ff]),
                ("v.blk.%d.ffn_down.weight" % i, [n_ff, n_embd]),
                ("v.blk.%d.ffn_down.bias" % i, [n_embd])]
tensors += [("mm.0.weight", [n_embd, n_text]), ("mm.0.bias", [n_text]),
            ("mm.2.weight", [n_text, n_text]), ("mm.2.bias", [n_text])]

rng = random.Random(7)
head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
for key, t, v in kv:
    head += s(key) + struct.pack("<I", t)
    if t == T_STR:
        head += s(v)
    elif t == T_U32:
        head += struct.pack("<I", v)
    elif t == T_F32:
        head += struct.pack("<f", v)
    elif t == T_BOOL:
        head += struct.pack("<B", 1 if v else 0)
    else:  # an array of f32
        head += struct.pack("<IQ", T_F32, len(v)) + struct.pack("<%df" % len(v), *v)

align = 32
data, offsets = b"", []
for name, ne in tensors:
    n = 1
    for d in ne:
        n *= d
    # norms near 1, everything else small: the encoder's numbers stay finite
    norm = name.endswith("ln1.weight") or name.endswith("ln2.weight")
    vals = [1.0 if norm else rng.uniform(-0.05, 0.05) for _ in range(n)]
    offsets.append(len(data))
    data += struct.pack("<%df" % n, *vals)
    data += b"\0" * (-len(data) % align)
for (name, ne), off in zip(tensors, offsets):
    head += s(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
    head += struct.pack("<IQ", 0, off)  # F32
head += b"\0" * (-len(head) % align)
with open(out, "wb") as f:
    f.write(head + data)
print("%s: %d tensors, %d bytes, projection to %d" % (out, len(tensors), len(head) + len(data), n_text))
