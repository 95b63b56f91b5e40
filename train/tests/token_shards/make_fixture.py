"""Makes the token-shard round-trip fixture: a small byte-level BPE tokenizer (trained here with
Hugging Face `tokenizers` on the corpus below, `<|endoftext|>` as its end-of-text token), the
corpus as a .txt and a .jsonl, and the ids Hugging Face gives each document, which
train/tests/token_shards.rs compares the shards `oxtrain tokenize` writes against.

    python3 train/tests/token_shards/make_fixture.py
"""
import json
import os

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

here = os.path.dirname(os.path.abspath(__file__))
txt = "It was the best of times, it was the worst of times.\n\nIt was the age of wisdom, " \
      "it was the age of foolishness; naïve café 42 times.\n"
docs = [
    "The quick brown fox jumps over the lazy dog.",
    "Pack my box with five dozen liquor jugs!",
    "  Sphinx of black quartz, judge my vow\n\twith tabs and ünïcödé.",
    "",
    "The end of times is the end of the corpus.",
]

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=300,
    special_tokens=["<|endoftext|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
)
tok.train_from_iterator([txt] + docs, trainer)
tok.save(os.path.join(here, "tokenizer.json"))

with open(os.path.join(here, "a.txt"), "w", encoding="utf-8") as f:
    f.write(txt)
with open(os.path.join(here, "b.jsonl"), "w", encoding="utf-8") as f:
    for d in docs:
        f.write(json.dumps({"text": d}) + "\n")

# A .txt is one document, a .jsonl one per line (as data.kind = "text_lm" reads them).
expected = {
    "eos": tok.token_to_id("<|endoftext|>"),
    "vocab_size": tok.get_vocab_size(with_added_tokens=True),
    "documents": [tok.encode(d).ids for d in [txt] + docs],
}
with open(os.path.join(here, "expected_ids.json"), "w") as f:
    json.dump(expected, f)


def write_datafile(filename, toks, magic, version, dtype):
    """llm.c's dev/data/data_common.py write_datafile: 256 int32 of header, then the tokens."""
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = magic, version, len(toks)
    with open(filename, "wb") as f:
        f.write(header.tobytes())
        f.write(np.array(toks, dtype=dtype).tobytes())


# The whole stream (each document then <|endoftext|>) in llm.c's two formats.
stream = [t for d in expected["documents"] for t in d + [expected["eos"]]]
write_datafile(os.path.join(here, "llmc_gpt2.bin"), stream, 20240520, 1, np.uint16)
write_datafile(os.path.join(here, "llmc_llama3.bin"), stream, 20240801, 7, np.uint32)
print("documents:", [len(d) for d in expected["documents"]], "vocab:", expected["vocab_size"])
