package cmdline

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCode(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{name: "success", err: nil, want: 0},
		{name: "a status of its own", err: Exit(2, errors.New("no connection")), want: 2},
		{name: "a status without a message", err: Exit(1, nil), want: 1},
		{name: "wrapped", err: fmt.Errorf("send: %w", Exit(2, nil)), want: 2},
		{name: "any other error", err: errors.New("flag"), want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, Code(tt.err))
		})
	}
	assert.Equal(t, "exit status 3", Exit(3, nil).Error())
	assert.Equal(t, "no connection", Exit(2, errors.New("no connection")).Error())
}
