"""Transaction assembly: decoded messages in, committed transactions (in commit order) out."""

from applier.assembly.staging import PreparedStore, StagedTransaction
from applier.assembly.transactions import Change, CommittedTransaction, TransactionAssembler

__all__ = ["Change", "CommittedTransaction", "PreparedStore", "StagedTransaction", "TransactionAssembler"]
