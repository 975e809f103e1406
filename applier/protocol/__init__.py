"""pgoutput protocol: message dataclasses, the pure decoder, and replication-protocol framing.

Others code against :func:`decode_message` and :class:`MessageDecoder`; the dataclasses in
``messages`` are the contract between decoding and everything after it.
"""

from applier.protocol.decoder import MessageDecoder, decode_message
from applier.protocol.messages import KIND_NAMES, KIND_OF, Message, TupleData

__all__ = ["KIND_NAMES", "KIND_OF", "Message", "MessageDecoder", "TupleData", "decode_message"]
