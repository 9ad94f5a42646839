"""Usage is billing history: a key with usage cannot be deleted (revoke it instead), and a deleted
model's usage rows stay, keeping its name in ``model_name``."""

import django.db.models.deletion
from django.db import migrations, models


def copy_model_names(apps, schema_editor):
    Usage = apps.get_model("gateway", "Usage")
    ServedModel = apps.get_model("registry", "ServedModel")
    for model_id, name in ServedModel.objects.filter(usage__isnull=False).distinct().values_list("pk", "name"):
        Usage.objects.filter(model_id=model_id).update(model_name=name)


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0001_initial"),
        ("gateway", "0002_requestsample_ts_index"),
        ("registry", "0001_initial"),
    ]

    operations = [
        migrations.AlterField(
            model_name="usage",
            name="key",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="usage", to="accounts.apikey"
            ),
        ),
        migrations.AddField(
            model_name="usage",
            name="model_name",
            field=models.CharField(default="", help_text="the model's name when it was used", max_length=100),
            preserve_default=False,
        ),
        migrations.RunPython(copy_model_names, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="usage",
            name="model",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="usage",
                to="registry.servedmodel",
            ),
        ),
    ]
