package main

import (
	"context"
	"fmt"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/structs"
	"github.com/knadh/koanf/v2"
)

func init() {
	register(command{name: "config print", summary: "print the effective configuration, secrets redacted", run: runConfigPrint})
}

func runConfigPrint(ctx context.Context, args []string) error {
	fs, path := flagSet("config print")
	cfg, err := loadConfig(fs, path, args)
	if err != nil {
		return err
	}
	k := koanf.New(".")
	if err := k.Load(structs.Provider(cfg.Redacted(), "koanf"), nil); err != nil {
		return err
	}
	out, err := k.Marshal(yaml.Parser())
	if err != nil {
		return err
	}
	fmt.Print(string(out))
	return nil
}
