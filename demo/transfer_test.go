package demo_test

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/posthorn/posthorn/core"
	"github.com/posthorn/posthorn/demo"
)

// Every random transfer is a posting the API accepts (ParsePosting is its
// validation: balanced per currency, positive amounts), between distinct
// accounts of the range, and over many postings every account is drawn
// about equally often and every line count (2 to 4, as the accounts allow)
// occurs.
func TestRandomTransferDrawsDistinctAccountsEvenly(t *testing.T) {
	for _, accounts := range []int{2, 3, 4, 40} {
		t.Run(strconv.Itoa(accounts)+" accounts", func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(accounts)))
			const postings = 20000
			perAccount := make([]int, accounts)
			perLines := map[int]int{}
			draws := 0
			for range postings {
				body := demo.RandomTransfer(rng, "acc-", accounts, demo.DefaultCurrencies)
				p, err := core.ParsePosting(body)
				if err != nil {
					t.Fatalf("%s: %v", body, err)
				}
				seen := map[string]bool{}
				for _, e := range p.Entries {
					if seen[e.Account] {
						t.Fatalf("account %s twice in %s", e.Account, body)
					}
					seen[e.Account] = true
					i, err := strconv.Atoi(strings.TrimPrefix(e.Account, "acc-"))
					if err != nil || i < 0 || i >= accounts {
						t.Fatalf("account %q outside acc-0 … acc-%d", e.Account, accounts-1)
					}
					perAccount[i]++
					draws++
				}
				perLines[len(p.Entries)]++
			}
			// Each account's share within 15% of the even share: for 40
			// accounts (1,500 draws each) that is six standard deviations,
			// so only a biased draw fails (and the seed is fixed).
			even := float64(draws) / float64(accounts)
			for i, n := range perAccount {
				if float64(n) < 0.85*even || float64(n) > 1.15*even {
					t.Errorf("acc-%d drawn %d times, want about %.0f", i, n, even)
				}
			}
			for lines := 2; lines <= min(4, accounts); lines++ {
				if perLines[lines] == 0 {
					t.Errorf("no posting of %d lines: %v", lines, perLines)
				}
			}
			for lines := range perLines {
				if lines < 2 || lines > min(4, accounts) {
					t.Errorf("postings of %d lines: %v; want 2 to %d lines", lines, perLines, min(4, accounts))
				}
			}
		})
	}
}

// BenchmarkRandomTransfer is the load generator's cost per posting body,
// spent on the machine it measures: time and allocations per body over a
// fixed 100,000 bodies (make bench runs every benchmark once).
func BenchmarkRandomTransfer(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	const bodies = 100000
	for b.Loop() {
		for range bodies {
			demo.RandomTransfer(rng, "acc-e2e-", 1000, demo.DefaultCurrencies)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*bodies), "ns/body")
	b.ReportMetric(testing.AllocsPerRun(100, func() { demo.RandomTransfer(rng, "acc-e2e-", 1000, demo.DefaultCurrencies) }), "allocs/body")
	b.ReportMetric(0, "ns/op") // the workload is fixed; ns/op means nothing here
}
