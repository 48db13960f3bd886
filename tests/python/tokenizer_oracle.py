#!/usr/bin/env python3
"""Reference tokenizers for kilter's exact-match tests (tests/e2e/tokenizer_exact.sh).

  train-hf OUT.json CORPUS_DIR [split]  byte-level BPE (vocab 4096) with HF `tokenizers` (PyPI);
                                        split: Llama-3's Split regex + ByteLevel without regex,
                                        behind an NFC normalizer (Qwen2-style); extras: NFKC +
                                        Lowercase + Replace, add_prefix_space, added tokens with
                                        lstrip (special) and rstrip (normal)
  train-sp bpe|unigram OUT.model DIR    SentencePiece (Debian python3-sentencepiece)
  corpus OUT.jsonl [MAX_BYTES=16384]    the check corpus: every /usr/share/doc/*/copyright that is
                                        UTF-8 (its first MAX_BYTES, cut at a line end), plus crafted
                                        documents (non-ASCII, emoji, CRLF, whitespace runs, digits)
  check KIND TOKENIZER CORPUS.jsonl KILTER.jsonl DATASET
                                        KIND hf|sp: the oracle's ids for every document equal
                                        kilter's (KILTER.jsonl from tokenizer_tool, and the dataset
                                        `kilter prep` wrote), kilter's decode equals the oracle's,
                                        and index.h5 records the tokenizer file.
Exits 77 when the oracle package is missing (ctest counts the test as skipped).
"""
import glob
import json
import os
import sys


def need(module):
    try:
        return __import__(module)
    except ImportError:
        print(f"SKIP: python module {module!r} is missing "
              "(scripts/install-deps.sh --with-test-extras installs it)")
        sys.exit(77)


def corpus_files(directory):
    # fortune files: skip the *.dat indexes and the *.u8 links.
    return sorted(f for f in glob.glob(os.path.join(directory, "*"))
                  if os.path.isfile(f) and not os.path.islink(f) and not f.endswith(".dat"))


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def train_hf(out, directory, variant="gpt2"):
    tokenizers = need("tokenizers")
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, trainers)
    tok = Tokenizer(models.BPE())
    if variant == "extras":
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(),
                                               normalizers.Replace("``", '"')])
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    elif variant == "split":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train(corpus_files(directory), trainer)
    if variant == "extras":
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True, normalized=False)])
        tok.add_tokens([AddedToken("[SEP]", rstrip=True)])
    tok.save(out)
    print(f"trained HF byte-level BPE ({tokenizers.__version__}, {variant}): vocab {tok.get_vocab_size()}")


def train_sp(kind, out, directory):
    spm = need("sentencepiece")
    lines = []
    for path in corpus_files(directory):
        with open(path, encoding="utf-8", errors="replace") as f:
            lines += [line.rstrip("\r\n") for line in f if line.strip() and line.strip() != "%"]
    text = out + ".txt"
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    spm.SentencePieceTrainer.train(input=text, model_prefix=out[:-len(".model")], vocab_size=4000,
                                   model_type=kind, character_coverage=0.9995,
                                   minloglevel=1)
    sp = spm.SentencePieceProcessor(model_file=out)
    print(f"trained SentencePiece {kind}: vocab {sp.get_piece_size()} from {len(lines)} lines")


CRAFTED = [
    "naïve café, Straße, Ærøskøbing, Ελληνικά, русский текст, 日本語のテキスト, 한국어, עברית, العربية",
    "emoji: 😀😃 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ and ✨sparkles✨",
    "Windows line ends\r\nsecond line\r\n\r\nafter a blank line\r\n",
    "runs of whitespace:" + " " * 300 + "end\n\n\n\n\t\t\t  \n" + " " * 17 + "x",
    "trailing spaces   ",
    "   leading spaces",
    "\n\n\nleading newlines",
    "digits 0 1 12 123 1234 12345 3.14159 2,718,281 0x1F 1e-9 ٣٤٥ ²³ ½",
    "contractions: I'm, you're, he's, we've, they'll, I'd, don't, CAN'T, it's",
    "tabs\tand\u00a0no-break\u2009thin\u3000ideographic spaces",
    "combining: e\u0301 a\u0308 n\u0303 and precomposed é ä ñ",
    "mixed 'quotes' “curly” «guillemets» — dashes – and… ellipsis",
    "a special token inside text: <|endoftext|> and after it",
    "<|endoftext|>",
    "code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; } // comment",
    "URL https://example.org/path?q=1&r=2#frag and mail a.b@example.com",
    "zero width\u200bjoiner\u200dand BOM\ufeffinside",
    "x" * 500,
    "!" * 100 + "?" * 3,
    "CJK without spaces: 这是一个没有空格的中文句子，用于测试。",
    "Unicode spaces: a\u0085\u0085 b x\u2028y \u2029 z v\x0bw  \x0b x f\x1cg \x1d h\x1e\x1fi end \u0085",
    "CASE 'S 'LL 'Ve HELLO'RE and numbers 1234567 12 3",
    "added tokens: Hello<mask>world, Hello <mask> world, a  <mask>b, x[SEP]  y, x [SEP]\n\ny, [SEP], lower [sep] too",
    "compatibility forms: ÉCOLE ǅ ﬁ ① ㎏ ``quoted`` İstanbul ΣΑΣ ß ﬀ",
]


def corpus(out, max_bytes="16384"):
    max_bytes = int(max_bytes)
    docs, skipped = [], 0
    for path in sorted(glob.glob("/usr/share/doc/*/copyright")):
        try:
            with open(path, "rb") as f:
                raw = f.read(max_bytes)
        except OSError:
            continue
        if len(raw) == max_bytes and b"\n" in raw:
            raw = raw[: raw.rindex(b"\n") + 1]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            skipped += 1
            continue
        docs.append(text)
    docs += CRAFTED
    with open(out, "w", encoding="utf-8") as f:
        for text in docs:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    print(f"check corpus: {len(docs)} documents ({len(CRAFTED)} crafted), "
          f"{skipped} non-UTF-8 copyright files left out")


def dataset_documents(directory):
    h5py = need("h5py")
    with h5py.File(os.path.join(directory, "index.h5"), "r") as index:
        num_shards = int(index.attrs["num_shards"])
        recorded = bytes(index["tokenizer_data"][()]) if "tokenizer_data" in index else b""
        attrs = {k: index.attrs[k] for k in ("tokenizer", "vocab_size", "eos_id")}
        if isinstance(attrs["tokenizer"], bytes):
            attrs["tokenizer"] = attrs["tokenizer"].decode()
    docs = []
    for s in range(num_shards):
        with h5py.File(os.path.join(directory, f"shard-{s:05d}.h5"), "r") as shard:
            tokens, offsets = shard["tokens"][()], shard["offsets"][()]
            docs += [tokens[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]
    return docs, recorded, attrs


def check(kind, tokenizer_path, corpus_path, kilter_path, dataset):
    if kind == "hf":
        need("tokenizers")
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(tokenizer_path)
        encode = lambda text: tok.encode(text, add_special_tokens=False).ids
        decode = lambda ids: tok.decode(ids, skip_special_tokens=False)
        expected_kind, eos = "hf-bpe", tok.token_to_id("<|endoftext|>")
        vocab = tok.get_vocab_size()
    else:
        spm = need("sentencepiece")
        sp = spm.SentencePieceProcessor(model_file=tokenizer_path)
        encode = lambda text: sp.encode(text)
        decode = lambda ids: sp.decode(ids)
        expected_kind, eos, vocab = "sentencepiece", sp.eos_id(), sp.get_piece_size()
    with open(corpus_path, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    with open(kilter_path, encoding="utf-8") as f:
        kilter = [json.loads(line) for line in f]
    assert len(kilter) == len(texts), f"tokenizer_tool wrote {len(kilter)} lines for {len(texts)} documents"
    expected = [encode(text) for text in texts]
    mismatches = 0
    for i, (text, ids, mine) in enumerate(zip(texts, expected, kilter)):
        if mine["ids"] != ids:
            mismatches += 1
            if mismatches <= 3:
                first = next((k for k in range(min(len(ids), len(mine["ids"])))
                              if ids[k] != mine["ids"][k]), min(len(ids), len(mine["ids"])))
                print(f"MISMATCH document {i} ({text[:60]!r}...): first difference at token {first}: "
                      f"oracle {ids[first:first + 8]} kilter {mine['ids'][first:first + 8]}")
        elif mine["text"] != decode([t for t in ids if t != eos]):  # kilter: EOS decodes to ""
            mismatches += 1
            if mismatches <= 3:
                print(f"DECODE MISMATCH document {i}: oracle {decode([t for t in ids if t != eos])[:80]!r} kilter {mine['text'][:80]!r}")
    assert mismatches == 0, f"{mismatches} of {len(texts)} documents differ from the oracle"

    docs, recorded, attrs = dataset_documents(dataset)
    nonempty = [ids for ids in expected if ids]
    assert docs == nonempty, (f"kilter prep's dataset ({len(docs)} documents) differs from the oracle's "
                              f"ids ({len(nonempty)} non-empty documents)")
    with open(tokenizer_path, "rb") as f:
        assert recorded == f.read(), "index.h5 tokenizer_data is not the tokenizer file"
    assert attrs["tokenizer"] == expected_kind, attrs
    assert int(attrs["eos_id"]) == eos and int(attrs["vocab_size"]) == vocab, (attrs, eos, vocab)
    tokens = sum(len(ids) for ids in expected)
    print(f"OK: {len(texts)} documents ({tokens} tokens) checked: kilter's ids and decode equal "
          f"the {kind} oracle's; the prep dataset holds the same {len(docs)} non-empty documents")


def main():
    command, args = sys.argv[1], sys.argv[2:]
    if command == "train-hf":
        train_hf(*args)
    elif command == "train-sp":
        train_sp(*args)
    elif command == "corpus":
        corpus(*args)
    elif command == "check":
        check(*args)
    else:
        sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main()
