"""max_context_length gets a lower bound of 2 (a prompt and an output token): a validator only."""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0002_alter_servedmodel_max_context_length"),
    ]

    operations = [
        migrations.AlterField(
            model_name="servedmodel",
            name="max_context_length",
            field=models.PositiveIntegerField(
                validators=[
                    django.core.validators.MinValueValidator(2),
                    django.core.validators.MaxValueValidator(16777216),
                ]
            ),
        ),
    ]
