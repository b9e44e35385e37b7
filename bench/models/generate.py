#!/usr/bin/env python3
"""Writes the parameter-tensor profiles that gradex-bench replays: resnet50.txt, bert_base.txt and
gpt2_small.txt, one tensor per line ("name dim dim ..."), in the order the frameworks register the
parameters (torchvision's ResNet-50, HuggingFace's BertModel for bert-base-uncased including the
pooler, HuggingFace's GPT2Model for gpt2 whose LM head is tied to wte and therefore counted once).

The lists are built from the architectures' definitions in plain Python: nothing is downloaded and
no framework is needed. Run from anywhere: python3 bench/models/generate.py [--check]
With --check the files are not written; the script fails if they differ from what it would write.
"""

import argparse
import math
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent


def resnet50():
    """torchvision.models.resnet50(): Bottleneck blocks [3, 4, 6, 3], expansion 4, 1000 classes.

    Conv layers have no bias; each BatchNorm registers weight then bias (running statistics are
    buffers, not parameters). Within a Bottleneck the order is conv1, bn1, conv2, bn2, conv3, bn3,
    then downsample (conv, bn) on the first block of each stage.
    """
    params = []

    def conv(name, out_ch, in_ch, k):
        params.append((f"{name}.weight", [out_ch, in_ch, k, k]))

    def bn(name, ch):
        params.append((f"{name}.weight", [ch]))
        params.append((f"{name}.bias", [ch]))

    conv("conv1", 64, 3, 7)
    bn("bn1", 64)
    in_ch = 64
    for stage, (width, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], start=1):
        out_ch = width * 4
        for b in range(blocks):
            p = f"layer{stage}.{b}"
            conv(f"{p}.conv1", width, in_ch, 1)
            bn(f"{p}.bn1", width)
            conv(f"{p}.conv2", width, width, 3)
            bn(f"{p}.bn2", width)
            conv(f"{p}.conv3", out_ch, width, 1)
            bn(f"{p}.bn3", out_ch)
            if b == 0:
                conv(f"{p}.downsample.0", out_ch, in_ch, 1)
                bn(f"{p}.downsample.1", out_ch)
            in_ch = out_ch
    params.append(("fc.weight", [1000, 2048]))
    params.append(("fc.bias", [1000]))
    return params


def bert_base():
    """transformers.BertModel(bert-base-uncased config): vocab 30522, hidden 768, 12 layers,
    intermediate 3072, 512 positions, 2 token types, with the pooler. nn.Linear weights are
    [out_features, in_features]."""
    vocab, hidden, layers, inter, positions, types = 30522, 768, 12, 3072, 512, 2
    params = []

    def linear(name, out_f, in_f):
        params.append((f"{name}.weight", [out_f, in_f]))
        params.append((f"{name}.bias", [out_f]))

    def layer_norm(name, n):
        params.append((f"{name}.weight", [n]))
        params.append((f"{name}.bias", [n]))

    params.append(("embeddings.word_embeddings.weight", [vocab, hidden]))
    params.append(("embeddings.position_embeddings.weight", [positions, hidden]))
    params.append(("embeddings.token_type_embeddings.weight", [types, hidden]))
    layer_norm("embeddings.LayerNorm", hidden)
    for i in range(layers):
        p = f"encoder.layer.{i}"
        linear(f"{p}.attention.self.query", hidden, hidden)
        linear(f"{p}.attention.self.key", hidden, hidden)
        linear(f"{p}.attention.self.value", hidden, hidden)
        linear(f"{p}.attention.output.dense", hidden, hidden)
        layer_norm(f"{p}.attention.output.LayerNorm", hidden)
        linear(f"{p}.intermediate.dense", inter, hidden)
        linear(f"{p}.output.dense", hidden, inter)
        layer_norm(f"{p}.output.LayerNorm", hidden)
    linear("pooler.dense", hidden, hidden)
    return params


def gpt2_small():
    """transformers.GPT2Model(gpt2 config): vocab 50257, 1024 positions, n_embd 768, 12 layers.
    GPT-2 uses Conv1D, whose weight is [in_features, out_features]. The causal-mask 'attn.bias' is a
    buffer, not a parameter. The LM head shares wte's storage, so it adds nothing."""
    vocab, positions, hidden, layers = 50257, 1024, 768, 12
    params = []

    def conv1d(name, in_f, out_f):
        params.append((f"{name}.weight", [in_f, out_f]))
        params.append((f"{name}.bias", [out_f]))

    def layer_norm(name, n):
        params.append((f"{name}.weight", [n]))
        params.append((f"{name}.bias", [n]))

    params.append(("wte.weight", [vocab, hidden]))
    params.append(("wpe.weight", [positions, hidden]))
    for i in range(layers):
        p = f"h.{i}"
        layer_norm(f"{p}.ln_1", hidden)
        conv1d(f"{p}.attn.c_attn", hidden, 3 * hidden)
        conv1d(f"{p}.attn.c_proj", hidden, hidden)
        layer_norm(f"{p}.ln_2", hidden)
        conv1d(f"{p}.mlp.c_fc", hidden, 4 * hidden)
        conv1d(f"{p}.mlp.c_proj", 4 * hidden, hidden)
    layer_norm("ln_f", hidden)
    return params


# file name -> (builder, description, expected parameter total, expected tensor count or None)
MODELS = {
    "resnet50.txt": (resnet50, "torchvision ResNet-50 (ImageNet, 1000 classes)", 25_557_032, 161),
    "bert_base.txt": (bert_base, "HuggingFace BertModel, bert-base-uncased, with pooler",
                      109_482_240, None),
    "gpt2_small.txt": (gpt2_small, "HuggingFace GPT2Model, gpt2 (LM head tied to wte)",
                       124_439_808, None),
}


def render(params, description):
    total = sum(math.prod(shape) for _, shape in params)
    lines = [
        f"# {description}",
        f"# {len(params)} parameter tensors, {total} parameters; generated by generate.py",
        "# format: name dim [dim ...], in the framework's parameter registration order",
    ]
    lines += [name + " " + " ".join(str(d) for d in shape) for name, shape in params]
    return "\n".join(lines) + "\n", total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="verify the files instead of writing")
    args = parser.parse_args()
    ok = True
    for file_name, (builder, description, want_total, want_count) in MODELS.items():
        params = builder()
        names = [n for n, _ in params]
        if len(set(names)) != len(names):
            sys.exit(f"{file_name}: duplicate parameter names")
        text, total = render(params, description)
        if total != want_total or (want_count is not None and len(params) != want_count):
            sys.exit(f"{file_name}: {len(params)} tensors / {total} parameters, expected "
                     f"{want_count} / {want_total}")
        path = HERE / file_name
        if args.check:
            if not path.exists() or path.read_text() != text:
                print(f"{path} is out of date; run {__file__}", file=sys.stderr)
                ok = False
        else:
            path.write_text(text)
            print(f"{path}: {len(params)} tensors, {total} parameters")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
