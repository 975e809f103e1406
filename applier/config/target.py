"""``target``: where the Delta tables and the applier's state go."""

from __future__ import annotations

from pydantic import Field, SecretStr, model_validator

from applier.config.base import PATH, SettingsModel
from applier.errors import ConfigError
from applier.storage.options import StorageOptions, put_in_force


class TargetSettings(SettingsModel):
    """Where the Delta tables go: ``<path>/<schema>/<table>`` unless a table rule says otherwise."""

    path: str = Field(json_schema_extra=PATH, description="root directory of the mirrored Delta tables: a local "
                      "directory or an s3://, gs:// or abfss:// URI (docs/object-storage.md)")
    state_dir: str | None = Field(
        None, json_schema_extra=PATH,
        description="applier state (catalog as last seen, staged prepared transactions, spill files, skip "
        "audit); default <path>/_applier, for an s3://, gs:// or abfss:// target a local directory of its own "
        "($XDG_STATE_HOME/applier/targets/..., docs/object-storage.md)")
    storage_options: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="an object-store target's settings when not (only) the cloud's environment: e.g. "
        "aws_access_key_id, aws_secret_access_key, aws_session_token, aws_region, aws_endpoint_url, aws_allow_http "
        "(abfss://: azure_storage_account_name, azure_storage_account_key; gs://: google_service_account). delta-rs, "
        "the lock and Spark's Hadoop settings (fs.s3a.bucket.<bucket>.*) all get them, for every location in the "
        "target's bucket; secrets are never printed (docs/object-storage.md)")

    @model_validator(mode="after")
    def _storage_options_in_force(self) -> TargetSettings:
        """Checked here (an unknown key is an error, not an option one engine ignores) and put in force for
        the process: every module that opens the bucket finds them there (applier.storage.options)."""
        if self.storage_options:
            raw = {key: value.get_secret_value() for key, value in self.storage_options.items()}
            try:
                options = StorageOptions.of(self.path, raw)
            except ConfigError as e:
                raise ValueError(str(e)) from None
            put_in_force(options)
        return self

