"""The data sets the harness reads: gsm8k.py (GSM8K's frozen test subset: load, select, hash, the chat
messages of a question). Below quality/ (the gate that scores it), tiny/ (the model trained on it) and
contract/: it imports none of them."""
