package configs

import (
	"net/url"
	"regexp"
)

// Redacted returns a copy with every secret replaced, for printing.
func (c Config) Redacted() Config {
	r := c
	r.Database.URL = RedactURL(c.Database.URL)
	r.Consumer.Database.URL = RedactURL(c.Consumer.Database.URL)
	r.API.Tokens = make([]string, len(c.API.Tokens))
	for i := range c.API.Tokens {
		r.API.Tokens[i] = redacted
	}
	r.Sink.NATS.URL = RedactURL(c.Sink.NATS.URL)
	r.Sink.AMQP.URL = RedactURL(c.Sink.AMQP.URL)
	r.Sink.Postgres.URL = RedactURL(c.Sink.Postgres.URL)
	r.Sink.NATS.Password = redactSecret(c.Sink.NATS.Password)
	r.Sink.NATS.Token = redactSecret(c.Sink.NATS.Token)
	r.Sink.AMQP.Password = redactSecret(c.Sink.AMQP.Password)
	r.Sink.Redis.Password = redactSecret(c.Sink.Redis.Password)
	r.Sink.Kafka.SASL.Password = redactSecret(c.Sink.Kafka.SASL.Password)
	r.Console.Token = redactSecret(c.Console.Token)
	if c.Console.Operators != nil {
		r.Console.Operators = make(map[string]string, len(c.Console.Operators))
		for name, t := range c.Console.Operators {
			r.Console.Operators[name] = redactSecret(t)
		}
	}
	r.Tracing.Endpoint = RedactQuery(c.Tracing.Endpoint)
	r.Reconcile.Consumers = make([]ReconcileConsumer, len(c.Reconcile.Consumers))
	for i, rc := range c.Reconcile.Consumers {
		r.Reconcile.Consumers[i] = rc
		r.Reconcile.Consumers[i].DatabaseURL = RedactURL(rc.DatabaseURL)
	}
	return r
}

const redacted = "REDACTED"

// redactSecret hides a set secret and keeps an empty one visible as empty.
func redactSecret(s string) string {
	if s == "" {
		return s
	}
	return redacted
}

var dsnPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('[^']*'|\S+)`)

// RedactURL hides the password of a URL or key=value DSN and any
// password-like query parameter.
func RedactURL(s string) string {
	if s == "" {
		return s
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return dsnPassword.ReplaceAllString(s, "${1}"+redacted)
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), redacted)
		}
	}
	q := u.Query()
	for key := range q {
		switch key {
		case "password", "sslpassword", "token":
			q.Set(key, redacted)
		}
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// RedactQuery hides the value of every query parameter of the URL s
// (tracing.endpoint?api_key=…): a collector's URL has no parameter that is
// safe to print by name. A value that does not parse is hidden whole.
func RedactQuery(s string) string {
	if s == "" {
		return s
	}
	u, err := url.Parse(s)
	if err != nil {
		return redacted
	}
	if u.User != nil {
		u.User = url.User(redacted)
	}
	q := u.Query()
	for key := range q {
		q.Set(key, redacted)
	}
	u.RawQuery = q.Encode()
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}
