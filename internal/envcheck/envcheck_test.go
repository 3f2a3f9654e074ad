package envcheck_test

import (
	"fmt"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/envcheck"
)

type tls struct {
	CA string `env:"CA"`
}

type sendCmd struct {
	Addr string `env:"TOOL_ADDR"`
	TxID string `env:"TOOL_TXID"`
	Arg  string `arg:"" optional:"" env:"TOOL_TARGET"`
	tls  `embed:"" envprefix:"TOOL_"`
}

type statusCmd struct {
	Admin string `env:"TOOL_ADMIN"`
}

type app struct {
	TargetTimeout string    `env:"TOOL_TARGET_TIMEOUT"`
	FailThreshold int       `env:"TOOL_FAIL_THRESHOLD"`
	Send          sendCmd   `cmd:""`
	Status        statusCmd `cmd:""`
}

func model(t *testing.T) *kong.Application {
	t.Helper()
	var a app
	k, err := kong.New(&a)
	require.NoError(t, err)
	return k.Model
}

func TestKnownHasEveryCommandsFlagsAndArguments(t *testing.T) {
	assert.Equal(t, []string{"TOOL_ADDR", "TOOL_ADMIN", "TOOL_CA", "TOOL_FAIL_THRESHOLD", "TOOL_TARGET", "TOOL_TARGET_TIMEOUT", "TOOL_TXID"},
		envcheck.Known(model(t)))
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name    string
		environ []string
		want    string // the error; empty for none
	}{
		{"no variable", nil, ""},
		{"every variable known, of any command", []string{"TOOL_TARGET_TIMEOUT=1s", "TOOL_ADMIN=x", "TOOL_CA=ca.pem", "TOOL_TARGET=CORE"}, ""},
		{"other prefixes are not the command's", []string{"PATH=/bin", "TOOLBOX_X=1", "TOO_ADDR=x"}, ""},
		{"a letter left out", []string{"TOOL_TARGET_TIMOUT=1s"}, "environment: TOOL_TARGET_TIMOUT: no such setting; did you mean TOOL_TARGET_TIMEOUT?"},
		{"two letters swapped", []string{"TOOL_FAIL_THERSHOLD=3"}, "environment: TOOL_FAIL_THERSHOLD: no such setting; did you mean TOOL_FAIL_THRESHOLD?"},
		{"empty value too", []string{"TOOL_ADRESS="}, "environment: TOOL_ADRESS: no such setting; did you mean TOOL_ADDR?"},
		{"several, sorted, each once", []string{"TOOL_TXD=1", "HOME=/root", "TOOL_ADMN=a", "TOOL_TXD=2"},
			"environment: TOOL_ADMN: no such setting; did you mean TOOL_ADMIN?; TOOL_TXD: no such setting; did you mean TOOL_TXID?"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := envcheck.Check(model(t), "TOOL_", tt.environ)
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.EqualError(t, err, tt.want)
		})
	}
}

func ExampleCheck() {
	var cli struct {
		TargetTimeout string `env:"RELAY_TARGET_TIMEOUT"`
	}
	k, err := kong.New(&cli)
	if err != nil {
		panic(err)
	}
	fmt.Println(envcheck.Check(k.Model, "RELAY_", []string{"RELAY_TARGET_TIMOUT=1s"}))
	// Output: environment: RELAY_TARGET_TIMOUT: no such setting; did you mean RELAY_TARGET_TIMEOUT?
}
