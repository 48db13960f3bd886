#!/usr/bin/python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/<harness>/): small valid
inputs of every format, and a few edge cases. The committed corpus is this script's output; rerun
it (Debian's python3 with numpy, sentencepiece and HF `tokenizers`, as scripts/install-deps.sh
--with-test-extras installs) after changing it: `tests/fuzz/make_seeds.py`.
The structure-aware harnesses (dataset, checkpoint) take a program for their HDF5 builder, not
HDF5 files: their seeds are choice bytes (see tests/fuzz/fuzz_dataset.cpp, fuzz_hdf5.h)."""
import io
import json
import os
import random
import shutil
import struct
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
REPO = os.path.dirname(os.path.dirname(HERE))

TEXT = ("Q: What is a fortune?\nA: A short text, told by a program, often a joke.\n"
        "It's 2024: the quick brown fox jumps over the lazy dog 12345 times!\n"
        "\u00e9t\u00e9 \u4e2d\u6587 \U0001F600 tabs\tand  spaces   end.\n")


def put(harness, name, data):
    d = os.path.join(CORPUS, harness)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def corpus_readers():
    put("text", "plain.txt", TEXT)
    put("text", "empty.txt", b"")
    put("text", "binary.bin", bytes(range(256)))
    put("jsonl", "records.jsonl", "".join(json.dumps({"text": line, "id": i}) + "\n"
                                          for i, line in enumerate(TEXT.splitlines())))
    put("jsonl", "escapes.jsonl", '{"text": "a\\nb\\t\\u00e9\\ud83d\\ude00 \\"q\\""}\n\n  \n{"text": ""}\n'
        '{"meta": {"text": [1, 2.5e3, null, true]}, "text": "last"}')
    put("jsonl", "bad.jsonl", '{"text": 5}\n')
    put("fortune", "fortunes", "A first fortune.\n%\nA second\none.\n%\n%\n\tIndented -- Author\n%\n")
    put("fortune", "crlf", "one\r\n%\r\ntwo\r\n%")
    put("fortune", "no-separator", TEXT)


def tokenizers():
    import sentencepiece as spm
    from tokenizers import ByteLevelBPETokenizer
    # A fixed path: the models record their training input's path (deterministic seeds).
    tmp = os.path.join(tempfile.gettempdir(), "kilter-make-seeds")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w") as f:
            for i in range(200):
                f.write(TEXT.replace("12345", str(i)))
        for kind, vocab in (("unigram", 64), ("bpe", 80)):
            prefix = os.path.join(tmp, kind)
            spm.SentencePieceTrainer.train(input=corpus, model_prefix=prefix, vocab_size=vocab,
                                           model_type=kind, character_coverage=1.0,
                                           minloglevel=2, normalization_rule_name="identity", num_threads=1)
            with open(prefix + ".model", "rb") as f:
                put("sentencepiece", kind + ".model", f.read())
        bpe = ByteLevelBPETokenizer()
        bpe.train(files=[corpus], vocab_size=512, min_frequency=2, special_tokens=["<|endoftext|>"],
                  show_progress=False)
        text = bpe.to_str()
        # One line per vocabulary entry and merge keeps the file small and diff-able.
        doc = json.loads(text)
        put("tokenizer_json", "bpe-512.json", json.dumps(doc, ensure_ascii=False, separators=(",", ":")))
        tiny = {"version": "1.0", "added_tokens": [{"id": 261, "content": "<|endoftext|>", "special": True,
                                                     "single_word": False, "lstrip": False, "rstrip": False,
                                                     "normalized": False}],
                "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]},
                "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                    {"type": "Digits", "individual_digits": True},
                    {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]},
                "decoder": {"type": "ByteLevel"},
                "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
                          "byte_fallback": False, "ignore_merges": False,
                          "vocab": {}, "merges": ["h e", "l l", ["he", "ll"], "\u0120 w"]}}
        vocab = {}  # GPT-2's bytes_to_unicode(), then four merges
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        for b, c in sorted(zip(bs, cs)):
            vocab[chr(c)] = b
        vocab.update({"he": 256, "ll": 257, "hell": 258, "\u0120w": 259})
        tiny["model"]["vocab"] = vocab
        put("tokenizer_json", "tiny-normalized.json", json.dumps(tiny, ensure_ascii=False))
        put("tokenizer_json", "not-bpe.json", '{"model": {"type": "WordPiece", "vocab": {}}}')
    finally:
        shutil.rmtree(tmp)
    put("bpe_encode", "sample.txt", TEXT)
    put("bpe_encode", "special.txt", "a<|endoftext|>b <|endoftext|>\n")
    put("bpe_encode", "invalid-utf8.bin", b"ok \xff\xfe \xc3 \xe4\xb8 \xf0\x9f\x98 trailing\x00nul")
    put("bpe_encode", "digits-spaces.txt", "  12 345\n\n\t 6789 it's they'll   x ")


def configs():
    for name in ("demo.ini", "small.ini", "gpt2-124m.ini"):
        with open(os.path.join(REPO, "inputs", name), "rb") as f:
            put("config_ini", name, f.read())
    put("config_ini", "odd.ini", "# comment\n; other\n[train]\nlr=1e-3\n[ data ]\ndir = a b\n[output]\n"
        "sample_prompt = \"x = y\"\n[unknown]\nkey = 1\n")
    put("config_override", "train.args", "--model.n_layer=2\n--train.lr=1e-3\n--data.dir=/tmp/d\n"
        "--train.precision=bf16\n--comm.algo=flat\n--resume\n/tmp/run\n--json")
    put("config_override", "separate.args", "--train.steps\n10\n--output.dir\nruns/x\n--data.sampler=naive")
    put("config_override", "bad.args", "--model.n_head=0\n--train.on_nonfinite=maybe")


def importers():
    rng = random.Random(17)
    toks = [rng.randrange(50257) for _ in range(40)] + [50256] + [rng.randrange(50257) for _ in range(20)]
    # llm.c: 256 int32 header (magic, version, token count), then the tokens.
    def llmc(magic, version, dtype, tokens):
        header = np.zeros(256, dtype="<i4")
        header[0], header[1], header[2] = magic, version, len(tokens)
        return header.tobytes() + np.array(tokens, dtype=dtype).tobytes()
    put("import_llmc", "gpt2-v1.bin", llmc(20240520, 1, "<u2", toks))
    put("import_llmc", "gpt2-v2.bin", llmc(20240520, 2, "<u4", toks))
    put("import_llmc", "llama3-v7.bin", llmc(20240801, 7, "<u4", [128000] + toks[:10] + [128000] + toks[10:20]))
    put("import_llmc", "empty-v1.bin", llmc(20240520, 1, "<u2", []))
    put("import_nanogpt", "train.bin", np.array(toks, dtype="<u2").tobytes())
    put("import_nanogpt", "odd.bin", b"\x01\x02\x03")
    # Megatron: 4-byte .idx length, the .idx, then the .bin (tests/fuzz/fuzz_import_megatron.cpp).
    def megatron(code, dtype, docs, multimodal=False):
        seqs = [s for d in docs for s in d]
        sizes = [len(s) for s in seqs]
        item = np.dtype(dtype).itemsize
        pointers, at = [], 0
        for s in sizes:
            pointers.append(at)
            at += s * item
        doc_idx, n = [0], 0
        for d in docs:
            n += len(d)
            doc_idx.append(n)
        idx = (b"MMIDIDX\x00\x00" + struct.pack("<QB", 1, code) + struct.pack("<QQ", len(seqs), len(doc_idx))
               + np.array(sizes, dtype="<i4").tobytes() + np.array(pointers, dtype="<i8").tobytes()
               + np.array(doc_idx, dtype="<i8").tobytes() + (bytes(len(seqs)) if multimodal else b""))
        bin_ = b"".join(np.array(s, dtype=dtype).tobytes() for s in seqs)
        return struct.pack("<I", len(idx)) + idx + bin_
    docs = [[toks[:5], toks[5:9]], [toks[9:20]], [], [toks[20:23]]]
    put("import_megatron", "u16.in", megatron(8, "<u2", docs))
    put("import_megatron", "i32-multimodal.in", megatron(4, "<i4", docs, multimodal=True))
    put("import_megatron", "u8.in", megatron(1, "u1", [[[1, 2, 3]], [[4]]]))
    put("import_megatron", "i64.in", megatron(5, "<i8", [[[7, 8]]]))
    for name, arr, version in (("u16-v1.npy", np.array(toks, dtype="<u2"), (1, 0)),
                               ("i64-v2.npy", np.array(toks[:10], dtype="<i8"), (2, 0)),
                               ("u32-v3.npy", np.array(toks[:10], dtype="<u4"), (3, 0)),
                               ("i32-be.npy", np.array(toks[:10], dtype=">i4"), (1, 0)),
                               ("2d.npy", np.array(toks[:12], dtype="<u2").reshape(3, 4), (1, 0)),
                               ("fortran.npy", np.asfortranarray(np.array(toks[:12], dtype="<u2").reshape(3, 4)), (1, 0)),
                               ("f32.npy", np.array([1.0, 2.0], dtype="<f4"), (1, 0)),
                               ("empty.npy", np.array([], dtype="<u2"), (1, 0))):
        buf = io.BytesIO()
        np.lib.format.write_array(buf, arr, version=version)
        put("import_npy", name, buf.getvalue())


def builders():
    # fuzz_dataset: vocab pick, tokenizer pick (+0x80: tokenizer_data follows), shards-1, then per
    # shard a document count and per document a length and 2 bytes per token; every later choice
    # byte 0 = valid (an exhausted input reads as zeros).
    put("dataset", "empty", b"")
    def dataset(vocab_pick, tok_pick, shards):
        out = bytes([vocab_pick, tok_pick, len(shards) - 1])
        for docs in shards:
            out += bytes([len(docs)])
            for doc in docs:
                out += bytes([len(doc)]) + b"".join(struct.pack("<H", t) for t in doc)
        return out + bytes(64)
    put("dataset", "one-shard", dataset(0, 0, [[[72, 105], [33, 10, 0, 256]]]))
    put("dataset", "two-shards-u32", dataset(4, 1, [[[1, 2, 3], []], [[4], [5, 6, 7, 8, 9, 10, 11, 12]]]))
    put("dataset", "u16-edge", dataset(2, 2, [[[65534, 0]], [[1]]]))
    # Mutations: the first shard attribute (format) replaced by an array, by a missing value.
    base = dataset(0, 0, [[[72, 105]]])
    put("dataset", "mutated-attr-array", base[:9] + bytes([0x80 | 5, 3]) + bytes(64))
    put("dataset", "mutated-missing", base[:9] + bytes([0x80]) + bytes(64))
    # fuzz_checkpoint: 3 x 28 tensor value bytes, then choice bytes (0 = valid).
    rng = random.Random(8)
    values = bytes(rng.randrange(256) for _ in range(3 * 28))
    put("checkpoint", "valid", values + bytes(128))
    put("checkpoint", "no-values", b"")
    put("checkpoint", "tokenizer-data", values + bytes(18) + b"\x01\x10" + b"0123456789abcdef" + bytes(64))
    put("checkpoint", "array-step", values + bytes(3) + bytes([0x80 | 5, 7]) + bytes(128))


def main():
    if os.path.isdir(CORPUS):
        shutil.rmtree(CORPUS)
    corpus_readers()
    tokenizers()
    configs()
    importers()
    builders()
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(CORPUS) for f in fs)
    print(f"make_seeds: wrote {CORPUS} ({total} bytes)")


if __name__ == "__main__":
    sys.exit(main())
