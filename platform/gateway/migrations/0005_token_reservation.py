"""Token reservations: an admitted request holds the most it may cost against its key's daily
quota until it ends (gateway/reservations.py)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0001_initial'),
        ('gateway', '0004_ratelimitstate_replaces_ratewindow'),
    ]

    operations = [
        migrations.CreateModel(
            name='TokenReservation',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('tokens', models.PositiveBigIntegerField(help_text='prompt estimate + n x max_tokens')),
                ('created_at', models.DateTimeField(help_text="admission, by the database clock: the quota's day")),
                ('expires_at', models.DateTimeField(help_text='from then on it no longer counts')),
                ('key', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='accounts.apikey')),
            ],
            options={
                'indexes': [models.Index(fields=['expires_at'], name='gateway_reservation_expiry')],
            },
        ),
    ]
