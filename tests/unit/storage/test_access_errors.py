"""What a store's refusal says: in that store's words (a container and AZURE_* variables for abfss://, a bucket
and GOOGLE_* for gs://), one line, which setting to fix. The servers' own answers are in
tests/integration/test_object_storage.py; here, the store's error texts as object_store words them."""

from __future__ import annotations

import pytest

from applier.storage.objects import _access_error


class NotFoundError(Exception):
    """obstore's name for a 404 (its class is matched by name)."""


@pytest.mark.parametrize(("uri", "error", "said"), [
    ("abfss://c@acct.dfs.core.windows.net/m", Exception("403 Forbidden: AuthorizationFailure"),
     "the store refused the credentials (AZURE_STORAGE_ACCOUNT_NAME / AZURE_STORAGE_ACCOUNT_KEY"),
    ("abfss://c@acct.dfs.core.windows.net/m", Exception("404 The specified container does not exist. "
                                                        "ContainerNotFound"), "the container 'c' does not exist"),
    ("az://c/m", NotFoundError("Object at location m/_applier/x not found"), "the container 'c' does not exist"),
    ("gs://b/m", NotFoundError("Object at location m/_applier/x not found"), "the bucket 'b' does not exist"),
    ("gs://b/m", Exception("Error performing PUT http://127.0.0.1:9/b/m - HTTP error: error sending request"),
     "the endpoint cannot be reached (the service account's gcs_base_url"),
    # CI once read "403" inside the probe's random file name and blamed the credentials for a closed port.
    ("abfss://c@acct.dfs.core.windows.net/m", Exception(
        "Generic MicrosoftAzure error: Error performing PUT http://127.0.0.1:42693/acct/c/m/_applier/.write-check-"
        "d58b62faee344a04a24031ce3e47d580 in 379ms, after 3 retries - HTTP error: error sending request"),
     "the endpoint cannot be reached (AZURE_STORAGE_ENDPOINT"),
    ("s3://b/m", Exception("Client error with status 403 Forbidden: <Error/>"),
     "the store refused the credentials (AWS_ACCESS_KEY_ID"),
    ("s3://b/m", Exception("403 Forbidden: SignatureDoesNotMatch"),
     "the store refused the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY")])
def test_a_refusal_names_the_setting_to_fix_in_the_stores_own_words(uri: str, error: Exception, said: str) -> None:
    message = _access_error("writing", f"{uri}/_applier/x", error, uri).message
    assert said in message and "\n" not in message, message
