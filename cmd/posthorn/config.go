package main

import (
	"context"
	"fmt"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/structs"
	"github.com/knadh/koanf/v2"
)

func runConfigPrint(ctx context.Context, args []string) error {
	p, err := newFlags("config print").start(ctx, args, needs{})
	if err != nil {
		return err
	}
	k := koanf.New(".")
	if err := k.Load(structs.Provider(p.cfg.Redacted(), "koanf"), nil); err != nil {
		return err
	}
	out, err := k.Marshal(yaml.Parser())
	if err != nil {
		return err
	}
	fmt.Print(string(out))
	return nil
}
