"""The requests-per-minute limit becomes exact: one GCRA state row per key (its theoretical
arrival time) replaces the per-minute request counters. The counters are not carried over: each
key starts with its full burst."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0001_initial"),
        ("gateway", "0003_usage_outlives_keys_and_models"),
    ]

    operations = [
        migrations.CreateModel(
            name="RateLimitState",
            fields=[
                (
                    "key",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="accounts.apikey",
                    ),
                ),
                (
                    "tat_ns",
                    models.BigIntegerField(
                        help_text="theoretical arrival time: from then on the key has its full burst "
                        "again (nanoseconds since the Unix epoch)"
                    ),
                ),
            ],
        ),
        migrations.DeleteModel(name="RateWindow"),
    ]
