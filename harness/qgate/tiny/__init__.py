"""The built-in tiny models, built locally because no model hub can be reached (qgate.models resolves a
contract's `model` to one of them):

  qwen3.py     `tiny`: the random tiny Qwen3 (tokenizer, chat template, fp16 weights) and the build /
               cache helpers every other module here builds on; imports none of them
  train.py     `tiny-trained`: qwen3's model trained on the 16 frozen GSM8K items (qgate.gsm8k)
  wide.py      `tiny-trained-wide`, the demo's: train's model with its MLP zero-padded to 8192
  qwen4exp.py  `tiny-qwen4exp`: a tiny Qwen4Exp (transformers' classes, GDN + attention, HC 4)

Below quality/ and the workloads: nothing here imports qgate.quality (tools/import_cycles.py).
"""
